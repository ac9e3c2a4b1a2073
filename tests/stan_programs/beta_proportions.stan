// Beta regression of proportions: mean mu, precision kappa.
data {
  int<lower=0> N;
  vector[N] x;
  vector<lower=0, upper=1>[N] y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> kappa;
}
model {
  vector[N] mu = inv_logit(alpha + beta * x);
  alpha ~ normal(0, 2.5);
  beta ~ normal(0, 2);
  kappa ~ gamma(2, 0.1);
  y ~ beta(mu * kappa, (1 - mu) * kappa);
}
