"""Results: fit objects, ArviZ conversion, outlier scores, held-out predictive density and influence curves."""
