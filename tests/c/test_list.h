/* X(name): every C test. Add a test here and define TEST(name) in a file. */
#define UST_TEST_LIST(X)          \
  X(dim_compile_grammar)          \
  X(dim_eval_and_bucket)          \
  X(route_key_distinguishes)      \
  X(route_table_full)             \
  X(route_table_threads)          \
  X(sampling_exact_fraction)      \
  X(hist_bucket_bounds)           \
  X(hist_quantile_accuracy)       \
  X(hist_merge_exact)             \
  X(config_defaults)              \
  X(config_errors_name_field)     \
  X(problem_errors_name_field)    \
  X(problems_shipped_load)        \
  X(engine_unknown_operator)      \
  X(engine_report_roundtrip)      \
  X(error_names)                  \
  X(parsers_survive_mutations)    \
  X(sha256_known_vectors)         \
  X(dlopen_verified_refuses_mismatch) \
  X(dlopen_verified_loads_pinned) \
  X(dlopen_verified_loads_each_file) \
  X(compare_rule_cases)           \
  X(compare_f16_decoding_all_patterns) \
  X(compare_integers_exactly)     \
  X(config_candidate_fields)      \
  X(engine_loads_pinned_native_candidate) \
  X(shadow_pool_bounds_inflight)  \
  X(expr_values)                  \
  X(expr_errors_name_position)    \
  X(expr_survives_mutations)      \
  X(hardware_profiles_shipped_load) \
  X(hardware_profile_errors_name_field) \
  X(roofline_reproduces_atrex_sol)  \
  X(roofline_definitions_reproduce_atrex) \
  X(roofline_definition_errors_name_field)
