// Two proportions, each observed once as a count of successes: scalar outcomes.
data {
  int<lower=0> n_control;
  int<lower=0, upper=n_control> y_control;
  int<lower=0> n_treated;
  int<lower=0, upper=n_treated> y_treated;
}
parameters {
  real<lower=0, upper=1> p_control;
  real<lower=0, upper=1> p_treated;
}
model {
  p_control ~ beta(2, 2);
  p_treated ~ beta(2, 2);
  y_control ~ binomial(n_control, p_control);
  y_treated ~ binomial(n_treated, p_treated);
}
generated quantities {
  real effect = p_treated - p_control;
}
