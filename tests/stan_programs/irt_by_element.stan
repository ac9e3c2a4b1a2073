// A Rasch item-response model, the likelihood written one response at a time over persons and items.
data {
  int<lower=1> I;                              // persons
  int<lower=1> J;                              // items
  array[I, J] int<lower=0, upper=1> y;         // y[i, j] = 1: person i answered item j right
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
  for (i in 1:I) {
    for (j in 1:J) {
      y[i, j] ~ bernoulli_logit(ability[i] - difficulty[j]);
    }
  }
}
