// Hierarchical model: one intercept per group, non-centred.
data {
  int<lower=0> N;
  int<lower=1> J;                          // groups
  array[N] int<lower=1, upper=J> group;
  vector[N] x;
  vector[N] y;
}
parameters {
  real mu;                  // population mean intercept
  real<lower=0> tau;        // between-group sd
  vector[J] z;              // standardised group effects
  real beta;
  real<lower=0> sigma;
}
transformed parameters {
  vector[J] a = mu + tau * z;   // group intercepts
}
model {
  mu ~ normal(0, 5);
  tau ~ normal(0, 2);
  z ~ std_normal();
  beta ~ normal(0, 2);
  sigma ~ exponential(1);
  y ~ normal(a[group] + beta * x, sigma);
}
