"""The bench's fixed choices, free of torch: random-weight model configs and workload names (read
by the flags in :mod:`~noulengine.bench.cli` and by the run in :mod:`~noulengine.bench.runner`,
so neither imports the other at load time)."""

# Random-weight model configs at realistic sizes (values copied from the public configs).
MODEL_CONFIGS = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "llama-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),  # Qwen2.5-0.5B sizes
    "llama-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                     rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),  # Llama-3-8B sizes
}


WORKLOAD_NAMES = ("typed_decisions", "long_state_16q", "long_state_32q", "agnews_1q")  # build_workloads' order
