// Simple regression with the priors and the likelihood added in one target += statement.
data {
  int<lower=0> N;
  vector[N] x;
  vector[N] y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> sigma;
}
model {
  target += normal_lpdf(alpha | 0, 5) + normal_lpdf(beta | 0, 2) + exponential_lpdf(sigma | 1)
            + normal_lpdf(y | alpha + beta * x, sigma);
}
