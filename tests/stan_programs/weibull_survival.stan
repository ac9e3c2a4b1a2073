// Weibull survival times (no censoring), one row at a time.
data {
  int<lower=0> N;
  vector[N] x;
  vector<lower=0>[N] y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> k;
}
model {
  alpha ~ normal(0, 5);
  beta ~ normal(0, 2);
  k ~ gamma(2, 1);
  for (n in 1:N)
    y[n] ~ weibull(k, exp(alpha + beta * x[n]));
}
