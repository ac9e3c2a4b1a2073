// robust-stan's native losses: the beta and gamma total losses of the normal, bernoulli_logit and
// poisson_log families, with their gradients computed in closed form (one autodiff node per call).
//
// The Stan-language functions in robust_stan.stanfunctions are the reference; these compute the
// same totals (DESIGN.md section 1's convention) and are checked against them in the test suite. A
// program declares them (robust_stan_native.stanfunctions), is translated with stanc's
// --allow-undefined, and is compiled with this header included first: stanc calls an undefined
// function unqualified from the model's namespace, which also sees the global one defined here.
//
// Per row, with lp = log p(y | theta) and log I = log of the integral of p^(1 + a):
//   beta  (divergence 1): total = sum_i w_i (-exp(a lp_i) / a + exp(log I_i) / (1 + a))
//   gamma (divergence 2): total = -((1 + a) / a) sum_i w_i exp(a lp_i - (a / (1 + a)) log I_i)
// so the derivative in any argument is sum_i (c_lp_i d lp_i + c_int_i d log I_i) with the row
// multipliers of rs_native::combine. Plain C++14 (httpstan 4.13 compiles models as C++14).
#ifndef ROBUST_STAN_NATIVE_HPP
#define ROBUST_STAN_NATIVE_HPP

#include <stan/math.hpp>

#include <cmath>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rs_native {

using Eigen::ArrayXd;
using Eigen::Index;

// A scalar broadcast to n rows, or a vector's values (its size checked against n).
template <typename T, stan::require_stan_scalar_t<T>* = nullptr>
inline ArrayXd row_values(const T& x, Index n, const char*, const char*) {
  return ArrayXd::Constant(n, stan::math::value_of(x));
}
template <typename T, stan::require_eigen_vector_t<T>* = nullptr>
inline ArrayXd row_values(const T& x, Index n, const char* function, const char* name) {
  stan::math::check_size_match(function, "rows of the outcome", n, name, x.size());
  return stan::math::value_of(x).array();
}
inline ArrayXd row_values(const std::vector<int>& x, Index n, const char* function, const char* name) {
  stan::math::check_size_match(function, "rows of the outcome", n, name, x.size());
  ArrayXd out(n);
  for (Index i = 0; i < n; ++i) out[i] = x[i];
  return out;
}

// True when every argument's scalar is a number or a reverse-mode var: the closed-form path. A program
// built with second-order autodiff (robust-stan's per-example gradients of a robustified program,
// STAN_MODEL_FVAR_VAR) also instantiates the functions with fvar<var>; there robustify routes every
// likelihood to the Stan functions, so the fvar overloads below exist to compile and refuse if called.
template <typename... Ts>
struct first_order
    : stan::math::conjunction<stan::math::disjunction<std::is_arithmetic<stan::scalar_type_t<Ts>>,
                                                      stan::is_var<stan::scalar_type_t<Ts>>>...> {};
template <typename... Ts>
using require_first_order_t = std::enable_if_t<first_order<Ts...>::value>;
template <typename... Ts>
using require_not_first_order_t = std::enable_if_t<!first_order<Ts...>::value>;

[[noreturn]] inline void refuse_forward_mode(const char* function) {
  throw std::domain_error(std::string(function) + ": the native loss has no forward-mode autodiff; "
                          "second derivatives take the Stan functions of robust_stan.stanfunctions");
}

inline void check_divergence(const char* function, int divergence, double a) {
  if (divergence != 1 && divergence != 2)
    throw std::domain_error(std::string(function) + ": divergence must be 1 (beta) or 2 (gamma), found "
                            + std::to_string(divergence) + " (KL and the original gamma take the Stan functions)");
  if (!(a > 0))  // NaN too
    throw std::domain_error(std::string(function) + ": the divergence parameter must be positive; found "
                            + std::to_string(a));
}

// The rows of a count family's arguments (y an int array, eta a real or a vector), checked.
struct CountRows {
  ArrayXd y;
  ArrayXd eta;
  ArrayXd w;
};
template <typename T_eta, typename T_w>
inline CountRows count_rows(const char* function, const std::vector<int>& y, const T_eta& eta, const T_w& w,
                            int divergence, double a) {
  check_divergence(function, divergence, a);
  const Index n = y.size();
  return CountRows{row_values(y, n, function, "y"), row_values(eta, n, function, "eta"),
                   row_values(w, n, function, "weights")};
}

// The weighted total loss and each row's multipliers of d lp and d log I (see the file's head).
struct Combined {
  double total;
  ArrayXd c_lp;
  ArrayXd c_int;
};
// beta, from each row's p^a = exp(a lp) and I
inline Combined combine_beta(const ArrayXd& p_a, const ArrayXd& integral, const ArrayXd& w, double a) {
  Combined out;
  out.total = (w * (integral / (1 + a) - p_a / a)).sum();
  out.c_lp = -w * p_a;
  out.c_int = w * integral / (1 + a);
  return out;
}
// gamma, from each row's lp and log I
inline Combined combine_gamma(const ArrayXd& lp, const ArrayXd& log_integral, const ArrayXd& w, double a) {
  Combined out;
  ArrayXd weighted = w * (a * lp - (a / (1 + a)) * log_integral).exp();
  out.total = -((1 + a) / a) * weighted.sum();
  out.c_lp = -(1 + a) * weighted;
  out.c_int = weighted;
  return out;
}
// either, from lp and log I
inline Combined combine(const ArrayXd& lp, const ArrayXd& log_integral, const ArrayXd& w, int divergence,
                        double a) {
  return divergence == 1 ? combine_beta((a * lp).exp(), log_integral.exp(), w, a)
                         : combine_gamma(lp, log_integral, w, a);
}

// poisson_log: log I_a and its slope in eta at one eta, off the table's grid. Up to
// lambda = min(max(1e3, 1e2 (1 + a)), 1e8) a direct sum over k within W = 20 + 12 sqrt(lambda / (1 + a) + 1)
// of the mode (a term W past the mode is below 1e-25 of the mode's); beyond, Stirling's series
// (the same bounds and coefficients as rs_poisson_log_integral_one in robust_stan.stanfunctions).
inline void poisson_log_integral_off_grid(double eta, double a, double& value, double& slope) {
  const double s = 1 + a;
  if (eta == -stan::math::INFTY) {
    value = 0;
    slope = 0;
    return;
  }
  const double lambda = std::exp(eta);
  if (lambda > std::fmin(std::fmax(1e3, 1e2 * s), 1e8)) {
    const double s2 = s * s;
    const double c1 = (s2 - 1) / (24 * s);
    const double c2 = (s2 - 1) * (s2 + 23) / (1152 * s2);
    const double c3 = (s2 - 1) * (5 * s2 * s2 - 298 * s2 + 11237) / (414720 * s2 * s);
    const double q = (c1 + (c2 + c3 / lambda) / lambda) / lambda;
    const double dq = -(c1 + (2 * c2 + 3 * c3 / lambda) / lambda) / lambda;  // lambda dq/dlambda
    value = -0.5 * a * (std::log(2 * stan::math::pi()) + eta) - 0.5 * std::log(s) + std::log1p(q);
    slope = -0.5 * a + dq / (1 + q);
    return;
  }
  const double mode = std::floor(lambda);
  const double width = std::floor(20 + 12 * std::sqrt(lambda / s + 1)) + 1;
  const double first = std::fmax(0.0, mode - width);
  const Index count = static_cast<Index>(mode + width - first) + 1;
  ArrayXd k = ArrayXd::LinSpaced(count, first, mode + width);
  ArrayXd log_terms(count);
  for (Index j = 0; j < count; ++j) log_terms[j] = s * (k[j] * eta - lambda - stan::math::lgamma(k[j] + 1));
  const double top = log_terms.maxCoeff();
  ArrayXd terms = (log_terms - top).exp();
  const double sum = terms.sum();
  value = top + std::log(sum);
  slope = s * ((terms * k).sum() / sum - lambda);
}

// poisson_log: log I_a and its slope per row, from robust_poisson_log_integral_table(a) where eta is
// on its grid (the piece x_j <= eta < x_{j+1}, as the Stan functions' bisection finds it).
template <typename T_table>
inline void poisson_log_integral(const ArrayXd& eta, double a, const T_table& table, ArrayXd& value,
                                 ArrayXd& slope) {
  static const char* function = "rs_native_poisson_log_total_loss";
  if (table.cols() != 5 || table.rows() < 1 || table(0, 2) != a)
    throw std::domain_error(std::string(function) + ": integral_table was built for a = "
                            + std::to_string(table.rows() ? table(0, 2) : 0.0)
                            + ", not for the divergence parameter " + std::to_string(a)
                            + " (build it with robust_poisson_log_integral_table(a))");
  const Index n = eta.size();
  const Index pieces = table.rows() - 1;
  const double lo = table(0, 0);
  const double h = table(0, 1);
  const double hi = lo + pieces * h;
  value.resize(n);
  slope.resize(n);
  for (Index i = 0; i < n; ++i) {
    const double x = eta[i];
    if (pieces > 0 && x >= lo && x < hi) {
      Index j = static_cast<Index>(std::floor((x - lo) / h));
      j = std::min<Index>(std::max<Index>(j, 0), pieces - 1);
      while (j > 0 && table(j + 1, 0) > x) --j;
      while (j + 1 < pieces && table(j + 2, 0) <= x) ++j;
      const double u = x - table(j + 1, 0);
      const double c0 = table(j + 1, 1), c1 = table(j + 1, 2), c2 = table(j + 1, 3), c3 = table(j + 1, 4);
      value[i] = c0 + u * (c1 + u * (c2 + u * c3));
      slope[i] = c1 + u * (2 * c2 + 3 * u * c3);
    } else {
      poisson_log_integral_off_grid(x, a, value[i], slope[i]);
    }
  }
}

}  // namespace rs_native

/** The weighted total loss sum_i w_i l_i of normal(y | mu, sigma) under the beta (divergence 1)
    or gamma (2) divergence with parameter a; mu and sigma each a real or a vector. */
template <typename T_y, typename T_mu, typename T_sigma, typename T_w,
          rs_native::require_first_order_t<T_mu, T_sigma>* = nullptr>
inline stan::return_type_t<T_mu, T_sigma> rs_native_normal_total_loss(const T_y& y, const T_mu& mu,
                                                                     const T_sigma& sigma, const T_w& w,
                                                                     int divergence, double a,
                                                                     std::ostream* pstream__) {
  static const char* function = "rs_native_normal_total_loss";
  static_assert(stan::is_constant_all<T_y, T_w>::value, "the outcome and the weights are data");
  rs_native::check_divergence(function, divergence, a);
  const auto& mu_ref = stan::math::to_ref(mu);
  const auto& sigma_ref = stan::math::to_ref(sigma);
  const Eigen::Index n = y.size();
  const rs_native::ArrayXd y_val = rs_native::row_values(y, n, function, "y");
  const rs_native::ArrayXd mu_val = rs_native::row_values(mu_ref, n, function, "mu");
  const rs_native::ArrayXd sigma_val = rs_native::row_values(sigma_ref, n, function, "sigma");
  const rs_native::ArrayXd w_val = rs_native::row_values(w, n, function, "weights");
  stan::math::check_positive(function, "sigma", sigma_val);
  auto ops = stan::math::make_partials_propagator(mu_ref, sigma_ref);
  if (n == 0) return ops.build(0.0);
  // a shared sigma: its log and the integral once, not per row
  const bool shared_sigma = stan::is_stan_scalar<T_sigma>::value;
  const rs_native::ArrayXd inv_sigma = sigma_val.inverse();
  const rs_native::ArrayXd z = (y_val - mu_val) * inv_sigma;
  const rs_native::ArrayXd log_sigma
      = shared_sigma ? rs_native::ArrayXd::Constant(n, std::log(sigma_val[0])) : rs_native::ArrayXd(sigma_val.log());
  const double half_log_two_pi = 0.5 * std::log(2 * stan::math::pi());
  const rs_native::ArrayXd lp = -0.5 * z.square() - log_sigma - half_log_two_pi;
  const rs_native::ArrayXd log_integral = -a * (half_log_two_pi + log_sigma) - 0.5 * std::log1p(a);
  const rs_native::Combined c
      = divergence == 2 ? rs_native::combine_gamma(lp, log_integral, w_val, a)
                        : rs_native::combine_beta((a * lp).exp(),
                                                  shared_sigma ? rs_native::ArrayXd::Constant(n, std::exp(log_integral[0]))
                                                               : rs_native::ArrayXd(log_integral.exp()),
                                                  w_val, a);
  if (!stan::is_constant_all<T_mu>::value)  // d lp / d mu = z / sigma; log I does not depend on mu
    stan::math::partials<0>(ops) = (c.c_lp * z * inv_sigma).matrix();
  if (!stan::is_constant_all<T_sigma>::value)  // d lp / d sigma = (z^2 - 1) / sigma, d log I / d sigma = -a / sigma
    stan::math::partials<1>(ops) = ((c.c_lp * (z.square() - 1) - a * c.c_int) * inv_sigma).matrix();
  return ops.build(c.total);
}

/** The weighted total loss of bernoulli_logit(y | eta) under the beta (1) or gamma (2) divergence;
    eta a real or a vector. With p = inv_logit(eta): I = p^(1+a) + (1-p)^(1+a), d lp / d eta = y - p,
    d I / d eta = (1 + a) p (1 - p) (p^a - (1 - p)^a). */
template <typename T_eta, typename T_w, rs_native::require_first_order_t<T_eta>* = nullptr>
inline stan::return_type_t<T_eta> rs_native_bernoulli_logit_total_loss(const std::vector<int>& y, const T_eta& eta,
                                                                      const T_w& w, int divergence, double a,
                                                                      std::ostream* pstream__) {
  static const char* function = "rs_native_bernoulli_logit_total_loss";
  static_assert(stan::is_constant_all<T_w>::value, "the weights are data");
  const auto& eta_ref = stan::math::to_ref(eta);
  const rs_native::CountRows rows = rs_native::count_rows(function, y, eta_ref, w, divergence, a);
  const rs_native::ArrayXd &y_val = rows.y, &eta_val = rows.eta, &w_val = rows.w;
  auto ops = stan::math::make_partials_propagator(eta_ref);
  if (y.empty()) return ops.build(0.0);
  // with e = exp(-|eta|): log p(1) = -log1p(e) - max(-eta, 0), log p(0) = log p(1) - eta, and the
  // probabilities 1 / (1 + e) and e / (1 + e), overflowing neither way
  const rs_native::ArrayXd e = (-eta_val.abs()).exp();
  const rs_native::ArrayXd lp1 = -(e.log1p() + (-eta_val).max(0.0));
  const rs_native::ArrayXd lp0 = lp1 - eta_val;
  const rs_native::ArrayXd larger = (1 + e).inverse(), smaller = e * larger;
  const rs_native::ArrayXd p1 = (eta_val >= 0).select(larger, smaller), p0 = (eta_val >= 0).select(smaller, larger);
  const rs_native::ArrayXd p1_a = (a * lp1).exp(), p0_a = (a * lp0).exp();
  const rs_native::ArrayXd integral = p1 * p1_a + p0 * p0_a;
  const rs_native::Combined c
      = divergence == 1 ? rs_native::combine_beta((y_val > 0).select(p1_a, p0_a), integral, w_val, a)
                        : rs_native::combine_gamma(y_val * lp1 + (1 - y_val) * lp0, integral.log(), w_val, a);
  if (!stan::is_constant_all<T_eta>::value)
    stan::math::partials<0>(ops)
        = (c.c_lp * (y_val - p1) + c.c_int * (1 + a) * p1 * p0 * (p1_a - p0_a) / integral).matrix();
  return ops.build(c.total);
}

/** The weighted total loss of poisson_log(y | eta) under the beta (1) or gamma (2) divergence, with
    log I_a from robust_poisson_log_integral_table(a) (rows off its grid: the direct sum or series);
    eta a real or a vector. d lp / d eta = y - exp(eta). */
template <typename T_eta, typename T_w, typename T_table, rs_native::require_first_order_t<T_eta>* = nullptr>
inline stan::return_type_t<T_eta> rs_native_poisson_log_total_loss(const std::vector<int>& y, const T_eta& eta,
                                                                  const T_w& w, int divergence, double a,
                                                                  const T_table& integral_table,
                                                                  std::ostream* pstream__) {
  static const char* function = "rs_native_poisson_log_total_loss";
  static_assert(stan::is_constant_all<T_w, T_table>::value, "the weights and the table are data");
  const auto& eta_ref = stan::math::to_ref(eta);
  const rs_native::CountRows rows = rs_native::count_rows(function, y, eta_ref, w, divergence, a);
  const rs_native::ArrayXd &y_val = rows.y, &eta_val = rows.eta, &w_val = rows.w;
  auto ops = stan::math::make_partials_propagator(eta_ref);
  if (y.empty()) return ops.build(0.0);
  const rs_native::ArrayXd lambda = eta_val.exp();
  const rs_native::ArrayXd lp = y_val * eta_val - lambda - (y_val + 1).unaryExpr([](double k) { return stan::math::lgamma(k); });
  rs_native::ArrayXd log_integral, integral_slope;
  rs_native::poisson_log_integral(eta_val, a, stan::math::value_of(integral_table), log_integral, integral_slope);
  const rs_native::Combined c = rs_native::combine(lp, log_integral, w_val, divergence, a);
  if (!stan::is_constant_all<T_eta>::value)
    stan::math::partials<0>(ops) = (c.c_lp * (y_val - lambda) + c.c_int * integral_slope).matrix();
  return ops.build(c.total);
}

// Forward-mode arguments (see rs_native::first_order): compiled, never called by robust-stan's programs.
template <typename T_y, typename T_mu, typename T_sigma, typename T_w,
          rs_native::require_not_first_order_t<T_mu, T_sigma>* = nullptr>
inline stan::return_type_t<T_mu, T_sigma> rs_native_normal_total_loss(const T_y&, const T_mu&, const T_sigma&,
                                                                     const T_w&, int, double, std::ostream*) {
  rs_native::refuse_forward_mode("rs_native_normal_total_loss");
}
template <typename T_eta, typename T_w, rs_native::require_not_first_order_t<T_eta>* = nullptr>
inline stan::return_type_t<T_eta> rs_native_bernoulli_logit_total_loss(const std::vector<int>&, const T_eta&,
                                                                      const T_w&, int, double, std::ostream*) {
  rs_native::refuse_forward_mode("rs_native_bernoulli_logit_total_loss");
}
template <typename T_eta, typename T_w, typename T_table, rs_native::require_not_first_order_t<T_eta>* = nullptr>
inline stan::return_type_t<T_eta> rs_native_poisson_log_total_loss(const std::vector<int>&, const T_eta&,
                                                                  const T_w&, int, double, const T_table&,
                                                                  std::ostream*) {
  rs_native::refuse_forward_mode("rs_native_poisson_log_total_loss");
}

#endif  // ROBUST_STAN_NATIVE_HPP
