// Poisson regression of counts with an exposure offset.
data {
  int<lower=0> N;
  int<lower=1> K;
  matrix[N, K] X;
  vector<lower=0>[N] exposure;
  array[N] int<lower=0> y;
}
transformed data {
  vector[N] log_exposure = log(exposure);
}
parameters {
  real alpha;
  vector[K] beta;
}
model {
  alpha ~ normal(0, 2);
  beta ~ normal(0, 1);
  y ~ poisson_log(log_exposure + alpha + X * beta);
}
