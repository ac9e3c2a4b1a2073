// The noise-aware DPVI post-processing model (Alrawajfeh, Jalko and Honkela; paper eq. 20 and A60,
// priors of appendix H.3), for the post-burn-in trace of DP-VI: for t = T*..T-1 and each coordinate j,
//   g~_{t+1, j} ~ normal(kappa * a_j * (phi_{t, j} - phi_star_j), noise_sd_j),   a = softplus(v),
//   phi_star ~ normal(phi_bar, phi_star_prior_sd),   v ~ normal(v_prior_mean, v_prior_sd),
// with the subsampling covariance set to 0 (section 3.3); phi_star_prior_sd is 1 in eq. A61 as printed and the
// trace's own sd in the authors' code. The likelihood is written with each
// coordinate's sufficient statistics over the trace, centred at the trace mean phi_bar
// (delta_t = phi_t - phi_bar, m = phi_star - phi_bar):
//   sum_t (g_t - c (delta_t - m))^2 = S_gg - 2 c (S_gd - m S_g) + c^2 (S_dd + n m^2),   c = kappa a_j,
// so a gradient costs O(d), not O(T d).
//
// The parameters are standardised, so that a sampler sees scales near 1 whatever the trace's (v is
// often 1e5 to 1e6 and phi_star's sd 1e-3): v = v_prior_mean + v_prior_sd * v_std, and
//   - non_centred = 0: m = location (the joint density above; an affine map, so a Laplace
//     approximation here is the one in (phi_star, v));
//   - non_centred = 1: m = mu(c) + location / sqrt(P(c)), where N(mu(c), 1 / P(c)) is m's exact
//     conditional posterior given a, P = 1 / phi_star_prior_sd^2 + n c^2 / noise_sd^2 and
//     mu = -c S_g / (noise_sd^2 P).
//     Then location ~ N(0, 1) exactly and independently of v_std, whose density is v's marginal
//     posterior: the same posterior of (phi_star, v), without the ridge between phi_star and a that
//     NUTS cannot cross when a is weakly identified.
functions {
  // P(c): the precision of m's conditional posterior given c = kappa a (the prior's plus the likelihood's)
  vector conditional_precision(vector c, int n_obs, vector noise_var, vector prior_var) {
    return 1 ./ prior_var + n_obs * square(c) ./ noise_var;
  }
}
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
  vector<lower=0>[d] phi_star_prior_sd; // eq. A61's 1, or the trace's sd
  int<lower=0, upper=1> non_centred;   // the parameterisation of phi_star (above)
}
transformed data {
  vector[d] noise_var = square(noise_sd);
  vector[d] prior_var = square(phi_star_prior_sd);
}
parameters {
  vector[d] location;
  vector[d] v_std;
}
transformed parameters {
  vector[d] v = v_prior_mean + v_prior_sd .* v_std;
  vector[d] a = log1p_exp(v);
  vector[d] phi_star;
  {
    vector[d] c = kappa * a;
    vector[d] precision = conditional_precision(c, n_obs, noise_var, prior_var);
    if (non_centred) {
      phi_star = phi_bar - c .* sum_g ./ (noise_var .* precision) + location ./ sqrt(precision);
    } else {
      phi_star = phi_bar + location;
    }
  }
}
model {
  vector[d] c = kappa * a;
  v_std ~ std_normal();
  if (non_centred) {
    // v's marginal posterior: m integrated out of the joint in closed form
    vector[d] precision = conditional_precision(c, n_obs, noise_var, prior_var);
    location ~ std_normal();
    target += -0.5 * sum((sum_gg - 2 * c .* sum_gd + square(c) .* sum_dd) ./ noise_var)
              + 0.5 * sum(square(c .* sum_g ./ noise_var) ./ precision) - 0.5 * sum(log(precision));
  } else {
    vector[d] m = location;
    vector[d] squares = sum_gg - 2 * c .* (sum_gd - m .* sum_g) + square(c) .* (sum_dd + n_obs * square(m));
    m ~ normal(0, phi_star_prior_sd);
    target += -0.5 * sum(squares ./ noise_var);  // noise_sd is data: its log terms are constants
  }
}
