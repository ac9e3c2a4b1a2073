// Two survey items rated on 1..K, each an ordinal regression on x: the first with a logistic link,
// one statement per respondent; the second with a probit link, vectorised.
data {
  int<lower=1> N;
  int<lower=3> K;
  vector[N] x;
  array[N] int<lower=1, upper=K> rating;
  array[N] int<lower=1, upper=K> item;
}
parameters {
  real beta;
  ordered[K - 1] c;
  real gamma;
  ordered[K - 1] d;
}
model {
  beta ~ normal(0, 2);
  gamma ~ normal(0, 2);
  c ~ normal(0, 3);
  d ~ normal(0, 3);
  for (n in 1:N) {
    rating[n] ~ ordered_logistic(x[n] * beta, c);
  }
  item ~ ordered_probit(x * gamma, d);
}
