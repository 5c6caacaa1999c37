/* X(name): every C test. Add a test here and define TEST(name) in a file. */

/* The kernel tracer's, in CUDA builds (against a stand-in libcupti). */
#if defined(UST_TEST_TRACER) && defined(UST_GPU_CUDA)
/* the router's with it: its timers are CUDA's */
#define UST_TEST_LIST_TRACER_CUDA(X) X(admit_keys_every_call_inside_a_tracer_window)
#else
#define UST_TEST_LIST_TRACER_CUDA(X)
#endif
#if defined(UST_TEST_TRACER)
#define UST_TEST_LIST_TRACER(X)                                        \
  X(tracer_times_calls_by_their_kernels_through_records)              \
  X(tracer_times_calls_by_their_kernels_through_callbacks)            \
  X(tracer_converts_records_in_another_clients_clock)                 \
  X(tracer_stands_down_for_the_profiler_and_resumes)                  \
  X(tracer_yields_to_an_injected_tool_not_to_an_idle_subscriber)      \
  X(tracer_drops_calls_whose_kernels_never_came)                      \
  X(tracer_buffers_outlive_the_tracer_they_were_handed_out_for)      \
  X(tracer_times_graph_replays_of_captured_calls)                     \
  X(tracer_grows_its_buffers_and_cuts_a_crowded_window)              \
  X(tracer_is_present_only_when_cupti_was_asked_for_and_loaded)        \
  UST_TEST_LIST_TRACER_CUDA(X)
#else
#define UST_TEST_LIST_TRACER(X)
#endif
#define UST_TEST_LIST(X)          \
  X(dim_compile_grammar)          \
  X(dim_eval_and_bucket)          \
  X(route_key_distinguishes)      \
  X(a_call_finds_the_route_its_key_names) \
  X(admit_keys_each_call_at_random_past_a_threads_warm_up) \
  X(admit_keys_every_call_while_the_thread_captures_a_graph) \
  X(hook_admit_tallies_on_the_hook_alone_and_enters_the_gate_for_the_rest) \
  X(a_call_standing_for_many_counts_them_and_is_timed_at_their_share) \
  X(route_table_full)             \
  X(route_table_threads)          \
  X(a_snapshot_holds_every_route_made_before_it) \
  X(sampling_exact_fraction)      \
  X(a_new_key_is_timed_whatever_the_sampling) \
  X(a_steady_key_is_sampled_at_the_steady_share) \
  X(device_time_estimate_leaves_first_calls_out) \
  X(device_time_estimate_weighs_each_sampling_stratum) \
  X(kernel_records_join_calls_in_any_order) \
  X(ring_delivers_in_order_and_counts_what_a_lap_overwrote) \
  X(ring_never_hands_out_an_entry_torn_by_a_concurrent_writer) \
  X(ring_refuses_what_it_cannot_be) \
  X(timer_queue_hands_out_the_oldest_and_takes_back_what_was_not_ready) \
  X(timer_queue_flush_waits_for_a_batch_another_harvest_holds) \
  X(hold_released_in_time_times_the_work_less_what_the_pair_adds) \
  X(a_call_that_synchronises_inside_while_held_is_dropped_at_the_deadline) \
  X(an_operator_whose_holds_give_up_twice_in_a_row_is_not_held_again) \
  X(a_hold_released_in_time_between_two_that_gave_up_starts_the_count_over) \
  X(a_device_whose_probe_cannot_run_and_a_hold_off_hold_nothing) \
  X(ring_on_a_gpu_carries_the_replays_of_a_captured_writer) \
  X(gate_snap_decides_each_replay_and_copies_when_it_verifies) \
  X(gate_snap_launches_its_body_from_the_device_once_the_copies_are_made) \
  X(gate_copy_copies_in_served_replays_only_at_any_alignment) \
  X(graph_replays_are_judged_as_eager_calls) \
  X(a_kept_call_is_told_its_verdict_once_whatever_the_end) \
  X(replays_of_a_route_changed_in_place_are_dropped_not_judged) \
  X(graph_calls_refused_or_dropped_leave_every_gate_closed) \
  X(a_later_pool_never_judges_an_earlier_pools_replays) \
  X(share_rule_in_64_bits_is_exact_up_to_2_64) \
  X(qualifying_process_confinement_kills_signals_to_others) \
  X(gate_word_round_trips_mode_and_shares) \
  X(gate_decides_each_replay_as_the_modes_decide_eager_calls) \
  X(a_site_that_cannot_serve_is_verified_as_in_shadow) \
  X(kernel_records_lost_or_stale_do_not_make_figures) \
  X(kernel_spans_of_a_candidates_run_count_its_kernels_and_those_of_the_ops_it_called) \
  X(staged_varlen_floors_settle_at_the_windows_conclusion_once_for_every_tag) \
  X(kernel_windows_never_reuse_a_slot_in_flight) \
  X(kernel_windows_keep_to_their_budget) \
  X(kernel_graph_replays_are_their_captured_calls) \
  X(kernel_graph_replays_of_unseen_graphs_count_on_the_routes_that_run_their_kernels) \
  X(kernel_graphs_made_during_captures_are_understudys_own) \
  X(kernel_graphs_changed_in_place_count_on_the_captured_calls_they_change) \
  X(kernel_graph_replays_missing_records_interleaved_captures_and_launches_inside_calls) \
  X(kernel_graph_replays_follow_the_graph_whose_capture_made_graphs_of_its_own) \
  X(kernel_launches_known_from_callbacks_join_without_external_ids) \
  X(hist_bucket_bounds)           \
  X(hist_quantile_accuracy)       \
  X(hist_merge_exact)             \
  X(seqtest_martingale_matches_quadrature) \
  X(seqtest_decisions_on_synthetic_pairs) \
  X(seqtest_promotion_error_rates_by_simulation) \
  X(config_defaults)              \
  X(config_errors_name_field)     \
  X(config_accepts_every_field_of_its_table_and_starts_from_its_defaults) \
  X(config_refuses_every_key_its_table_lacks_naming_the_keys_it_has) \
  X(config_field_table_is_well_formed) \
  X(problem_errors_name_field)    \
  X(problems_shipped_load)        \
  X(engine_unknown_operator)      \
  X(engine_report_roundtrip)      \
  X(error_names)                  \
  X(parsers_survive_mutations)    \
  X(fuzz_corpus_config)           \
  X(fuzz_corpus_problem)          \
  X(fuzz_corpus_state)            \
  X(fuzz_corpus_hardware)         \
  X(fuzz_corpus_reload)           \
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
  X(roofline_definition_errors_name_field) \
  X(int8_and_fp8_products_have_their_paths) \
  X(sequence_lengths_read_from_host_tensors) \
  X(varlen_attention_floored_by_each_sequence) \
  X(varlen_floor_deferred_reads_the_lengths_copied_from_the_device) \
  X(decode_attention_floored_by_each_sequence) \
  X(varlen_definitions_read_their_lengths) \
  X(reload_accepts_operators_given_as_mode_strings) \
  X(error_message_may_quote_the_last_error) \
  X(enable_keeps_the_hosts_log_sink) \
  X(shares_near_one_stay_near_one) \
  X(decision_keeps_its_rules_on_every_path) \
  X(decision_named_paths) \
  X(decision_arms_in_their_order) \
  X(decision_passed_is_the_machines_plain_call) \
  X(call_signature_keys_int_list_values) \
  X(tensor_list_argument_keys_on_its_first_tensor) \
  X(figures_snapshot_never_has_more_captured_than_calls) \
  X(a_routes_gate_follows_its_mode_at_every_replay) \
  X(a_route_changed_in_place_under_a_graph_runs_production_alone_in_replays) \
  X(a_replay_gated_from_the_host_verifies_what_the_device_would) \
  X(a_captured_shadow_goes_beside_the_chain_within_its_bound) \
  X(report_derive_from_additive_figures) \
  X(state_file_is_never_written_larger_than_enable_reads) \
  X(control_plane_stress) \
  X(flight_sweeps_a_call_at_its_deadline_and_holds_its_route_until_it_leaves) \
  X(flight_bound_grows_with_calls_returned_in_time_and_restarts_after_a_sweep) \
  X(flight_table_full_serves_production_and_says_so)
