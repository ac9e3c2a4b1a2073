// Daily counts per region from the day of its first case on: each region's series is part of a
// column of a two-dimensional outcome, and its first day has a likelihood statement of its own.
data {
  int<lower=1> T;                          // days
  int<lower=1> R;                          // regions
  array[R] int<lower=1, upper=T - 1> start;
  array[T, R] int<lower=0> cases;          // cases[t, r] = 0 before start[r]
}
parameters {
  vector[R] log_rate;
}
model {
  log_rate ~ normal(0, 3);
  for (r in 1:R) {
    cases[start[r], r] ~ poisson_log(log_rate[r] - 1);   // the first day, with fewer tests
    cases[(start[r] + 1):T, r] ~ poisson_log(log_rate[r]);
  }
}
