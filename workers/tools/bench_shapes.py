"""Model shapes for ``poolgate bench-arch``: family → size → the Hugging Face config of a real model's shape.

Each entry names its ``model_type`` and its ``architectures`` class, plus the
config values that differ from transformers' defaults; weights are random
(speed does not depend on them). To add a shape, add an entry here.
"""
from __future__ import annotations

SHAPES: dict[str, dict[str, dict]] = {
    "modernbert": {
        "base": dict(model_type="modernbert", architecture="ModernBertModel", hidden_size=768, num_hidden_layers=22,
                     num_attention_heads=12, intermediate_size=1152, vocab_size=50368,
                     pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281,
                     sep_token_id=50282),
        "tiny": dict(model_type="modernbert", architecture="ModernBertModel", hidden_size=64, num_hidden_layers=3,
                     num_attention_heads=4, intermediate_size=96, vocab_size=30522, local_attention=16,
                     pad_token_id=0, bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102),
    },
    "mpnet": {
        "base": dict(model_type="mpnet", architecture="MPNetModel", hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072, vocab_size=30527, max_position_embeddings=514),
    },
    "bert": {
        "base": dict(model_type="bert", architecture="BertModel", hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072, vocab_size=30522),
        "tiny": dict(model_type="bert", architecture="BertModel", hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=128, vocab_size=30522),
    },
    "gte": {
        "base": dict(model_type="gte", architecture="GteModel", hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072, vocab_size=30528, type_vocab_size=0,
                     pad_token_id=0, rope_theta=500000.0),
    },
    # Qwen3-0.6B (Qwen3-Embedding-0.6B's body): GQA 16/8 heads of 128, q/k norms, RoPE 1e6; "0.6b-4l" keeps
    # its layer shape with 4 of the 28 layers (a CPU run of the whole stack takes many minutes per path)
    "qwen3": {
        "0.6b": dict(model_type="qwen3", architecture="Qwen3Model", hidden_size=1024, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                     vocab_size=151669, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=True),
        "0.6b-4l": dict(model_type="qwen3", architecture="Qwen3Model", hidden_size=1024, num_hidden_layers=4,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                        vocab_size=151669, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                        tie_word_embeddings=True),
        "tiny": dict(model_type="qwen3", architecture="Qwen3Model", hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                     vocab_size=30522, max_position_embeddings=1024),
    },
    "nomic_bert": {
        "base": dict(model_type="nomic_bert", architecture="NomicBertModel", hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072, vocab_size=30528, max_position_embeddings=2048),
    },
}
