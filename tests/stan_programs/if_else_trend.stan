// A trend in time that is linear or logistic, chosen by a data switch: one likelihood
// statement per branch.
data {
  int<lower=0> N;
  vector[N] t;
  vector[N] y;
  int<lower=0, upper=1> logistic;
}
parameters {
  real a;
  real b;
  real<lower=0> s;
}
model {
  a ~ normal(0, 5);
  b ~ normal(0, 2);
  s ~ exponential(1);
  if (logistic == 1) {
    y ~ normal(a + b * inv_logit(t), s);
  } else {
    y ~ normal(a + b * t, s);
  }
}
