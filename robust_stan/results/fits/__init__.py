"""One fit class per method, whatever produced the model (as CmdStanPy's ``stanfit``): NUTS
(``mcmc``), robust-stan's VI (``variational``), Stan's own methods (``stan_methods``), Rob-ULA
(``rob_ula``) and calibrated fits (``calibrated``)."""
