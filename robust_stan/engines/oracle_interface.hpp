// robust-stan's C interface to a program compiled by httpstan.
//
// httpstan's own functions take the data and the parameters as Python objects
// on every call and build the model each time. This header is compiled into
// the same extension module (``-include``), next to httpstan's functions, and
// gives what a sampler driven from Python needs: a model built once with its
// data; log density, gradient and constrained values (with generated
// quantities from a seeded RNG) read from and written to caller-owned double
// buffers. robust_stan/engines/native_model.py binds it with ctypes.
#include <stan/io/array_var_context.hpp>
#include <stan/math/rev.hpp>
#ifdef STAN_MODEL_FVAR_VAR
#include <stan/math/mix.hpp>
#endif
#include <stan/model/model_base.hpp>
#include <stan/services/util/create_rng.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

// Defined by the program's generated C++ (stanc), further down this file.
stan::model::model_base &new_model(stan::io::var_context &data_context, unsigned int seed, std::ostream *msg_stream);

namespace robust_stan_interface {

inline char *copy_message(const std::string &text) {
  char *out = static_cast<char *>(std::malloc(text.size() + 1));
  if (out != nullptr) std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

// `count` names joined by '\n'.
inline std::vector<std::string> split_names(const char *joined, size_t count) {
  std::vector<std::string> names;
  const std::string all(joined != nullptr ? joined : "");
  size_t start = 0;
  for (size_t k = 0; k < count; ++k) {
    size_t end = all.find('\n', start);
    if (end == std::string::npos) end = all.size();
    names.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

// Variable k has ndims[k] dimensions, read in turn from `dims`.
inline std::vector<std::vector<size_t>> split_dims(const size_t *ndims, const size_t *dims, size_t count) {
  std::vector<std::vector<size_t>> out(count);
  size_t pos = 0;
  for (size_t k = 0; k < count; ++k)
    for (size_t j = 0; j < ndims[k]; ++j) out[k].push_back(dims[pos++]);
  return out;
}

// Runs `body`: 0 when it returns, 1 for a std::domain_error (a value outside a distribution's
// support) and 2 for any other error, with *error set to its message.
template <typename Body>
int status_of(char **error, Body &&body) {
  try {
    body();
  } catch (const std::domain_error &ex) {
    *error = copy_message(ex.what());
    return 1;
  } catch (const std::exception &ex) {
    *error = copy_message(ex.what());
    return 2;
  }
  return 0;
}

}  // namespace robust_stan_interface

extern "C" {

// A model of this program with the given data, in stan::io::array_var_context's
// layout (httpstan's split of the data: values column-major), or NULL with
// *error set (free it with robust_stan_free_message).
void *robust_stan_model_new(size_t n_real, const char *names_r, const double *values_r, size_t n_values_r,
                            const size_t *ndims_r, const size_t *dims_r, size_t n_int, const char *names_i,
                            const int *values_i, size_t n_values_i, const size_t *ndims_i, const size_t *dims_i,
                            char **error) {
  using namespace robust_stan_interface;
  *error = nullptr;
  try {
    stan::io::array_var_context context(
        split_names(names_r, n_real), std::vector<double>(values_r, values_r + n_values_r),
        split_dims(ndims_r, dims_r, n_real), split_names(names_i, n_int),
        std::vector<int>(values_i, values_i + n_values_i), split_dims(ndims_i, dims_i, n_int));
    std::ostringstream messages;
    return &new_model(context, 1u, &messages);
  } catch (const std::exception &ex) {
    *error = copy_message(ex.what());
  }
  return nullptr;
}

void robust_stan_model_free(void *model) { delete static_cast<stan::model::model_base *>(model); }

void robust_stan_free_message(char *message) { std::free(message); }

size_t robust_stan_num_params(void *model) { return static_cast<stan::model::model_base *>(model)->num_params_r(); }

// The log density at theta (constants of ~ statements dropped, as httpstan's
// log_prob and log_prob_grad) into *value and, when grad is not NULL, its
// gradient into grad. Returns 0; or 1 for a std::domain_error (a value
// outside a distribution's support) and 2 for any other error, with *error set.
int robust_stan_log_density_gradient(void *handle, int jacobian, const double *theta, double *value, double *grad,
                                     char **error) {
  using stan::math::var;
  auto &model = *static_cast<stan::model::model_base *>(handle);
  *error = nullptr;
  const size_t n = model.num_params_r();
  const int status = robust_stan_interface::status_of(error, [&] {
    Eigen::Matrix<var, -1, 1> params(n);
    for (size_t i = 0; i < n; ++i) params.coeffRef(i) = theta[i];
    std::ostringstream messages;
    var lp = jacobian ? model.template log_prob<true, true>(params, &messages)
                      : model.template log_prob<true, false>(params, &messages);
    *value = lp.val();
    if (grad != nullptr) {
      lp.grad();
      for (size_t i = 0; i < n; ++i) grad[i] = params.coeff(i).adj();
    }
  });
  stan::math::recover_memory();
  return status;
}

// How many values robust_stan_write_array writes: the constrained parameters,
// then (if asked) the transformed parameters and the generated quantities.
size_t robust_stan_num_constrained(void *handle, int include_tp, int include_gqs) {
  std::vector<std::string> names;
  static_cast<stan::model::model_base *>(handle)->constrained_param_names(names, include_tp != 0, include_gqs != 0);
  return names.size();
}

// The constrained values at theta (Stan's write_array) into `out`, which holds
// robust_stan_num_constrained(...) values. Generated quantities draw their
// random numbers from an RNG started with `seed`. Returns 0, or 2 with *error set.
int robust_stan_write_array(void *handle, const double *theta, int include_tp, int include_gqs, unsigned int seed,
                            double *out, char **error) {
  auto &model = *static_cast<stan::model::model_base *>(handle);
  *error = nullptr;
  try {
    Eigen::VectorXd params = Eigen::Map<const Eigen::VectorXd>(theta, model.num_params_r());
    Eigen::VectorXd values;
    stan::rng_t rng = stan::services::util::create_rng(seed, 1);
    std::ostringstream messages;
    model.write_array(rng, params, values, include_tp != 0, include_gqs != 0, &messages);
    std::copy(values.data(), values.data() + values.size(), out);
  } catch (const std::exception &ex) {
    *error = robust_stan_interface::copy_message(ex.what());
    return 2;
  }
  return 0;
}

// Stan's standalone generated quantities for one chain's draws: for each of the
// `n_draws` rows of `constrained` (the constrained parameters, Stan's order, as
// written by the sampler), unconstrain them and write_array with the
// transformed parameters and generated quantities into the matching row of
// `out` (robust_stan_num_constrained(handle, 1, 1) values per row). One RNG,
// stan::services::util::create_rng(seed, chain), serves the chain's draws in
// order, as in CmdStan's generate_quantities. Returns 0, or 2 with *error set.
int robust_stan_generated_quantities(void *handle, size_t n_draws, const double *constrained, unsigned int seed,
                                     unsigned int chain, double *out, char **error) {
  auto &model = *static_cast<stan::model::model_base *>(handle);
  *error = nullptr;
  try {
    std::vector<std::string> names;
    model.constrained_param_names(names, false, false);
    const size_t n_in = names.size();
    names.clear();
    model.constrained_param_names(names, true, true);
    const size_t n_out = names.size();
    stan::rng_t rng = stan::services::util::create_rng(seed, chain);
    std::ostringstream messages;
    Eigen::VectorXd unconstrained(model.num_params_r());
    Eigen::VectorXd values;
    for (size_t s = 0; s < n_draws; ++s) {
      Eigen::VectorXd row = Eigen::Map<const Eigen::VectorXd>(constrained + s * n_in, n_in);
      model.unconstrain_array(row, unconstrained, &messages);
      model.write_array(rng, unconstrained, values, true, true, &messages);
      std::copy(values.data(), values.data() + n_out, out + s * n_out);
    }
  } catch (const std::exception &ex) {
    *error = robust_stan_interface::copy_message(ex.what());
    return 2;
  }
  return 0;
}

// Mixed second derivatives of the log density, forward mode over reverse mode
// (stan::math::fvar<var>): for each of the first `n_first` coordinates k of theta,
// one sweep with the tangent e_k gives d/d theta_j (d log density / d theta_k) for
// every j; out[(j - n_first) * n_first + k] receives it for j >= n_first. With a
// program whose likelihood weights w are its last parameters (target linear in w),
// row j of `out` is then the gradient of observation j's weighted term: all
// per-example gradients from n_first sweeps, whatever the number of rows.
// Needs the program built with STAN_MODEL_FVAR_VAR (the fvar<var> log_prob);
// returns 3 with *error set when it was not, else as
// robust_stan_log_density_gradient.
int robust_stan_mixed_second_derivatives(void *handle, int jacobian, const double *theta, size_t n_first,
                                         double *out, char **error) {
  *error = nullptr;
#ifdef STAN_MODEL_FVAR_VAR
  using stan::math::fvar;
  using stan::math::var;
  auto &model = *static_cast<stan::model::model_base *>(handle);
  const size_t n = model.num_params_r();
  const int status = robust_stan_interface::status_of(error, [&] {
    if (n_first > n) throw std::invalid_argument("n_first is larger than the number of parameters");
    for (size_t k = 0; k < n_first; ++k) {
      Eigen::Matrix<fvar<var>, -1, 1> params(n);
      for (size_t i = 0; i < n; ++i) params.coeffRef(i) = fvar<var>(var(theta[i]), var(i == k ? 1.0 : 0.0));
      std::ostringstream messages;
      fvar<var> lp = jacobian ? model.template log_prob<true, true>(params, &messages)
                              : model.template log_prob<true, false>(params, &messages);
      lp.d_.grad();
      for (size_t j = n_first; j < n; ++j) out[(j - n_first) * n_first + k] = params.coeff(j).val_.adj();
      stan::math::recover_memory();
    }
  });
  stan::math::recover_memory();
  return status;
#else
  (void)handle, (void)jacobian, (void)theta, (void)n_first, (void)out;
  *error = robust_stan_interface::copy_message(
      "this program was built without second-order autodiff (STAN_MODEL_FVAR_VAR)");
  return 3;
#endif
}

}  // extern "C"
