// Groups of different sizes stored one after another (a ragged array), as the Stan User's Guide
// writes them: one statement per group on segment(y, pos, size).
data {
  int<lower=0> N;
  int<lower=1> K;
  array[K] int<lower=1> s;
  vector[N] y;
}
parameters {
  vector[K] mu;
  real<lower=0> sigma;
}
model {
  mu ~ normal(0, 5);
  sigma ~ exponential(1);
  {
    int pos = 1;
    for (k in 1:K) {
      segment(y, pos, s[k]) ~ normal(mu[k], sigma);
      pos = pos + s[k];
    }
  }
}
