// Repeated measures: R subjects measured at the same C times, the whole matrix Y in one
// statement; and counts of the same design as a two-dimensional int array, flattened in one too.
data {
  int<lower=1> R;
  int<lower=1> C;
  vector[C] t;
  matrix[R, C] Y;
  array[R, C] int<lower=0> counts;
}
parameters {
  vector[R] a;
  real b;
  real<lower=0> sigma;
  real c0;
  real c1;
}
model {
  matrix[R, C] mu = rep_matrix(a, C) + b * rep_matrix(t', R);
  a ~ normal(0, 5);
  b ~ normal(0, 2);
  sigma ~ exponential(1);
  c0 ~ normal(0, 2);
  c1 ~ normal(0, 1);
  // to_vector reads a matrix column after column, mu too
  to_vector(Y) ~ normal(to_vector(mu), sigma);
  // to_array_1d reads an array row after row: the log rates of row i are c0 + c1 * t
  to_array_1d(counts) ~ poisson_log(to_vector(rep_matrix(c0 + c1 * t, R)));
}
