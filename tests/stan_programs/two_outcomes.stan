// Two outcomes sharing a predictor: a measurement and a binary flag.
data {
  int<lower=0> N;
  vector[N] x;
  vector[N] y;                            // measurement
  array[N] int<lower=0, upper=1> flag;    // binary outcome
}
parameters {
  real a;
  real b;
  real<lower=0> sigma;
  real c;
  real d;
}
model {
  a ~ normal(0, 5);
  b ~ normal(0, 2);
  sigma ~ exponential(1);
  c ~ normal(0, 2);
  d ~ normal(0, 2);
  y ~ normal(a + b * x, sigma);
  flag ~ bernoulli_logit(c + d * x);
}
