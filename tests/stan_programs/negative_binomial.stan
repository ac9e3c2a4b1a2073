// Negative binomial regression (overdispersed counts).
data {
  int<lower=0> N;
  vector[N] x;
  array[N] int<lower=0> y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> phi;       // inverse overdispersion
}
model {
  alpha ~ normal(0, 2);
  beta ~ normal(0, 1);
  phi ~ gamma(2, 0.5);
  y ~ neg_binomial_2_log(alpha + beta * x, phi);
}
