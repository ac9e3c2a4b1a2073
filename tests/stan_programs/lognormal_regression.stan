// Log-normal regression of a positive outcome.
data {
  int<lower=0> N;
  vector[N] x;
  vector<lower=0>[N] y;
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
  y ~ lognormal(alpha + beta * x, sigma);
}
