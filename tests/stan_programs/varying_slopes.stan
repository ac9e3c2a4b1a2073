// Varying intercepts and slopes by group, correlated through an LKJ prior.
data {
  int<lower=0> N;
  int<lower=1> J;
  array[N] int<lower=1, upper=J> group;
  vector[N] x;
  vector[N] y;
}
parameters {
  vector[2] gamma;                     // population intercept and slope
  vector<lower=0>[2] tau;              // their sds across groups
  cholesky_factor_corr[2] L_Omega;     // their correlation
  matrix[2, J] z;
  real<lower=0> sigma;
}
transformed parameters {
  matrix[J, 2] coef = rep_matrix(gamma', J) + (diag_pre_multiply(tau, L_Omega) * z)';
}
model {
  vector[N] mu;
  gamma ~ normal(0, 5);
  tau ~ exponential(1);
  L_Omega ~ lkj_corr_cholesky(2);
  to_vector(z) ~ std_normal();
  sigma ~ exponential(1);
  mu = coef[group, 1] + coef[group, 2] .* x;
  y ~ normal(mu, sigma);
}
