// A normal model whose likelihood is written as a target increment.
data {
  int<lower=0> N;
  vector[N] y;
}
parameters {
  real mu;
  real<lower=0> sigma;
}
model {
  target += normal_lupdf(mu | 0, 10);
  target += exponential_lupdf(sigma | 1);
  target += normal_lupdf(y | mu, sigma);
}
