// One intercept alpha under one of eight likelihoods, chosen by the data `family`; the outcomes of
// the other seven are given empty. Every other parameter of a density is fixed.
data {
  int<lower=1, upper=8> family;
  int<lower=0> N_pos;
  vector<lower=0>[N_pos] y_pos;              // 1 lognormal, 2 gamma, 3 weibull
  int<lower=0> N_unit;
  vector<lower=0, upper=1>[N_unit] y_unit;   // 4 beta
  int<lower=0> N_count;
  array[N_count] int<lower=0> y_count;       // 5 neg_binomial_2, 6 beta_binomial (of `trials`)
  array[N_count] int<lower=0> trials;
  int<lower=0> N_ord;
  array[N_ord] int<lower=1, upper=4> y_ord;  // 7 ordered_logistic, 8 ordered_probit
  ordered[3] c;
}
parameters {
  real alpha;
}
model {
  alpha ~ normal(0, 2.5);
  if (family == 1) {
    y_pos ~ lognormal(alpha, 0.8);
  } else if (family == 2) {
    y_pos ~ gamma(3, 3 * exp(-alpha));
  } else if (family == 3) {
    y_pos ~ weibull(2, exp(alpha));
  } else if (family == 4) {
    y_unit ~ beta(10 * inv_logit(alpha), 10 * (1 - inv_logit(alpha)));
  } else if (family == 5) {
    y_count ~ neg_binomial_2_log(alpha, 20);
  } else if (family == 6) {
    y_count ~ beta_binomial(trials, 8 * inv_logit(alpha), 8 * (1 - inv_logit(alpha)));
  } else if (family == 7) {
    y_ord ~ ordered_logistic(rep_vector(alpha, N_ord), c);
  } else {
    y_ord ~ ordered_probit(alpha, c);
  }
}
