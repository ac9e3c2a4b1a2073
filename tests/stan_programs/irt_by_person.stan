// The same Rasch model with one statement per person: row i of y holds person i's responses.
data {
  int<lower=1> I;
  int<lower=1> J;
  array[I, J] int<lower=0, upper=1> y;
}
parameters {
  vector[I] ability;
  vector[J] difficulty;
  real<lower=0> sigma_ability;
}
model {
  ability ~ normal(0, sigma_ability);
  difficulty ~ normal(0, 2);
  sigma_ability ~ exponential(1);
  for (i in 1:I) y[i] ~ bernoulli_logit(ability[i] - difficulty);
}
