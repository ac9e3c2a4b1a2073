// Overdispersed binomial counts: y successes of n trials per unit, success probability varying
// around a logistic regression on x with precision kappa.
data {
  int<lower=0> N;
  array[N] int<lower=0> n;
  array[N] int<lower=0> y;
  vector[N] x;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> kappa;
}
transformed parameters {
  vector[N] mu = inv_logit(alpha + beta * x);
}
model {
  alpha ~ normal(0, 2);
  beta ~ normal(0, 2);
  kappa ~ gamma(2, 0.1);
  y ~ beta_binomial(n, mu * kappa, (1 - mu) * kappa);
}
