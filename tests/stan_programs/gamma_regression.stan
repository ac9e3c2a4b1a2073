// Gamma regression with a log link, mean mu and shape.
data {
  int<lower=0> N;
  vector[N] x;
  vector<lower=0>[N] y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> shape;
}
model {
  vector[N] mu = exp(alpha + beta * x);
  alpha ~ normal(0, 5);
  beta ~ normal(0, 2);
  shape ~ gamma(2, 0.5);
  target += gamma_lpdf(y | shape, shape ./ mu);
}
