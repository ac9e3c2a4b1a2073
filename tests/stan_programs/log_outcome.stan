// Regression on the log of a positive outcome, the log taken in transformed data.
data {
  int<lower=0> N;
  vector[N] x;
  vector<lower=0>[N] y;
}
transformed data {
  vector[N] log_y = log(y);
}
parameters {
  real alpha;
  real beta;
  real<lower=0> sigma;
}
model {
  alpha ~ normal(0, 5);
  beta ~ normal(0, 2);
  sigma ~ exponential(1);
  log_y ~ normal(alpha + beta * x, sigma);
}
