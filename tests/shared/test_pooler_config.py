"""--pooler-config: vLLM's fields, aliases, removed names and what is refused for now."""
import argparse

import pytest

from poolgate.shared.config.model_flags import add_model_arguments, worker_config_from_args
from poolgate.shared.config.pooler_config import PoolerConfig


def test_every_vllm_field_parses():
    cfg = PoolerConfig.from_json('{"task": "classify", "seq_pooling_type": "mean", "tok_pooling_type": "ALL", '
                                 '"use_activation": false, "dimensions": 64, "logit_mean": 0.5, '
                                 '"logit_sigma": 2.0, "enable_flash_late_interaction": true}')
    assert (cfg.task, cfg.sequence_pooling, cfg.token_pooling) == ("classify", "MEAN", "ALL")
    assert (cfg.use_activation, cfg.dimensions, cfg.logit_mean, cfg.logit_sigma) == (False, 64, 0.5, 2.0)
    assert PoolerConfig.from_dict(cfg.to_wire()) == cfg
    step = PoolerConfig.from_dict({"pooling_type": "STEP", "step_tag_id": 7, "returned_token_ids": [1, 2]})
    assert (step.token_pooling, step.step_tag_id, step.returned_token_ids) == ("STEP", 7, (1, 2))


def test_chunked_processing_fields():
    cfg = PoolerConfig.from_json('{"enable_chunked_processing": true, "max_embed_len": 3072000}')
    assert (cfg.enable_chunked_processing, cfg.max_embed_len) == (True, 3072000)
    assert PoolerConfig.from_dict({"enable_chunked_processing": True}).max_embed_len is None  # None = no cap
    assert PoolerConfig.from_dict(cfg.to_wire()) == cfg


@pytest.mark.parametrize("alias, seq, tok", [("cls", "CLS", None), ("LAST", "LAST", None), ("ALL", None, "ALL")])
def test_pooling_type_is_an_alias(alias, seq, tok):
    cfg = PoolerConfig(pooling_type=alias)
    assert (cfg.sequence_pooling, cfg.token_pooling) == (seq, tok)


@pytest.mark.parametrize("body, message", [
    ({"normalize": True}, "`normalize` was removed"),
    ({"task": "score"}, "`score` task was removed; use `classify` instead."),
    ({"task": "encode"}, "`encode` task was removed; use `token_embed` or `token_classify` instead."),
    ({"task": "generate"}, "is not one of"),
    ({"pooling_type": "MEAN", "seq_pooling_type": "CLS"}, "cannot be combined"),
    ({"seq_pooling_type": "MAX"}, "is not one of"),
    ({"logit_sigma": 0}, "must not be 0"),
    ({"dimensions": 0}, "positive"),
    ({"surprise": 1}, "unknown keys \\['surprise'\\]"),
    ({"max_embed_len": 4096}, "needs enable_chunked_processing"),
    ({"enable_chunked_processing": True, "max_embed_len": 0}, "max_embed_len must be a positive integer"),
    ({"enable_chunked_processing": True, "max_embed_len": 1.5}, "max_embed_len must be (a positive )?an integer"),
    ({"enable_chunked_processing": True, "max_embed_len": True}, "max_embed_len must be (a positive )?an integer"),
    ({"enable_chunked_processing": "yes"}, "enable_chunked_processing must be true or false"),
    ({"step_tag_id": 5}, "need STEP pooling"),
    ({"pooling_type": 5}, "pooling_type must be a string"),
    ({"use_activation": "no"}, "use_activation must be true or false"),
    ({"dimensions": "64"}, "dimensions must be an integer"),
    ({"dimensions": True}, "dimensions must be an integer"),
    ({"returned_token_ids": 5, "tok_pooling_type": "STEP"}, "returned_token_ids must be a list"),
    ({"returned_token_ids": ["a"], "tok_pooling_type": "STEP"}, "list of token ids"),
    ({"step_tag_id": "x", "tok_pooling_type": "STEP"}, "step_tag_id must be an integer"),
    ({"tok_pooling_type": "ALL", "returned_token_ids": [1]}, "need STEP pooling"),
])
def test_bad_configs_name_the_problem(body, message):
    with pytest.raises(ValueError, match=message):
        PoolerConfig.from_dict(body)


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    return parser.parse_args(list(flags))


def test_alias_flags_fold_into_the_pooler_config():
    cfg = worker_config_from_args(_args("--pooling-type", "mean", "--no-normalize"))
    assert (cfg.pooler_config.seq_pooling_type, cfg.pooler_config.use_activation) == ("MEAN", False)
    cfg = worker_config_from_args(_args("--pooler-config", '{"pooling_type": "CLS"}',
                                        "--hf-overrides", '{"is_matryoshka": true}'))
    assert cfg.pooler_config.sequence_pooling == "CLS" and cfg.hf_overrides == {"is_matryoshka": True}
    with pytest.raises(ValueError, match="both given"):
        worker_config_from_args(_args("--pooling-type", "mean", "--pooler-config", '{"pooling_type": "CLS"}'))


def test_a_bad_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        _args("--pooler-config", '{"normalize": true}')
    assert "`normalize` was removed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args("--hf-overrides", "[1]")
