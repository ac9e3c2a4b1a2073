"""Results: what the methods return (fit objects, coresets, DP-VI's fit and its posteriors, a
divergence selection), computations on their draws (ArviZ output, outlier scores, PSIS-LOO,
coverage) and plots."""
