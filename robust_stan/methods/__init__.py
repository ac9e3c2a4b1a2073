"""Inference methods, one module each: NUTS, Stan's own approximations, robust VI, Rob-ULA and its robust mean estimators."""
