// Location and covariance of multivariate normal observations.
data {
  int<lower=0> N;
  int<lower=1> D;
  array[N] vector[D] y;
}
parameters {
  vector[D] mu;
  vector<lower=0>[D] tau;
  cholesky_factor_corr[D] L;
}
model {
  mu ~ normal(0, 10);
  tau ~ lognormal(0, 1);
  L ~ lkj_corr_cholesky(3);
  y ~ multi_normal_cholesky(mu, diag_pre_multiply(tau, L));
}
