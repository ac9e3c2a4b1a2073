// The noise-aware DPVI post-processing model (Alrawajfeh, Jalko and Honkela; paper eq. 20 and A60,
// priors of appendix H.3), for the post-burn-in trace of DP-VI: for t = T*..T-1 and each coordinate j,
//   g~_{t+1, j} ~ normal(kappa * a_j * (phi_{t, j} - phi_star_j), noise_sd_j),   a = softplus(v),
// with the subsampling covariance set to 0 (section 3.3). The likelihood is written with each
// coordinate's sufficient statistics over the trace, centred at the trace mean phi_bar
// (delta_t = phi_t - phi_bar, m = phi_star - phi_bar):
//   sum_t (g_t - c (delta_t - m))^2 = S_gg - 2 c (S_gd - m S_g) + c^2 (S_dd + n m^2),   c = kappa a_j,
// so a gradient costs O(d), not O(T d).
data {
  int<lower=1> d;                      // dimension of phi
  int<lower=1> n_obs;                  // post-burn-in pairs (phi_t, g~_{t+1})
  real<lower=0, upper=1> kappa;        // sampling rate
  vector<lower=0>[d] noise_sd;         // sigma C / beta
  vector[d] phi_bar;                   // trace mean after burn-in
  vector[d] sum_g;                     // sum_t g~_{t+1}
  vector<lower=0>[d] sum_gg;           // sum_t g~_{t+1}^2
  vector[d] sum_gd;                    // sum_t g~_{t+1} delta_t
  vector<lower=0>[d] sum_dd;           // sum_t delta_t^2
  vector[d] v_prior_mean;              // appendix H.3
  vector<lower=0>[d] v_prior_sd;
}
parameters {
  vector[d] phi_star;
  vector[d] v;
}
transformed parameters {
  vector[d] a = log1p_exp(v);
}
model {
  vector[d] c = kappa * a;
  vector[d] m = phi_star - phi_bar;
  vector[d] squares = sum_gg - 2 * c .* (sum_gd - m .* sum_g) + square(c) .* (sum_dd + n_obs * square(m));
  phi_star ~ normal(phi_bar, 1);
  v ~ normal(v_prior_mean, v_prior_sd);
  target += -0.5 * sum(squares ./ square(noise_sd));  // noise_sd is data: its log terms are constants
}
