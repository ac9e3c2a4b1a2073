// Linear regression with an intercept and several predictors, with the priors rs.glm("normal") states.
data {
  int<lower=0> N;          // rows
  int<lower=1> K;          // predictors
  matrix[N, K] X;
  vector[N] y;
  vector<lower=0>[K] prior_scale_b;  // the slopes' prior sds
}
parameters {
  real alpha;              // intercept
  vector[K] beta;          // slopes
  real<lower=0> sigma;     // residual sd
}
model {
  alpha ~ normal(0, 2.5);
  beta ~ normal(0, prior_scale_b);
  sigma ~ exponential(1);
  y ~ normal(alpha + X * beta, sigma);   // the likelihood
}
generated quantities {
  vector[N] log_lik;       // pointwise log likelihood, for LOO
  for (n in 1:N) log_lik[n] = normal_lpdf(y[n] | alpha + X[n] * beta, sigma);
}
