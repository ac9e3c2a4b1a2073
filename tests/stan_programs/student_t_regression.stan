// Regression with Student-t errors and unknown degrees of freedom.
data {
  int<lower=0> N;
  vector[N] x;
  vector[N] y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> sigma;
  real<lower=1> nu;
}
model {
  alpha ~ normal(0, 5);
  beta ~ normal(0, 2);
  sigma ~ exponential(1);
  nu ~ gamma(2, 0.1);
  y ~ student_t(nu, alpha + beta * x, sigma);
}
