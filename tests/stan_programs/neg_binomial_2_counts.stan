// Overdispersed counts with an exposure, on the mean scale.
data {
  int<lower=0> N;
  vector[N] x;
  vector<lower=0>[N] exposure;
  array[N] int<lower=0> y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> phi;
}
model {
  alpha ~ normal(0, 2);
  beta ~ normal(0, 1);
  phi ~ exponential(0.1);
  target += neg_binomial_2_lpmf(y | exposure .* exp(alpha + beta * x), phi);
}
