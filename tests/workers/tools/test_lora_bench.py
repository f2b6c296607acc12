"""``poolgate bench-lora`` runs on a tiny BERT: three figures (base, one adapter, four mixed) and the JSON line."""
import json

from poolgate.gateway.cli import main as poolgate
from tests.fakes import make_tiny_checkpoint


def test_bench_lora_reports_the_three_ways(tmp_path, capsys):
    make_tiny_checkpoint(tmp_path)
    assert poolgate(["bench-lora", str(tmp_path), "--num-texts", "16", "--repeats", "1", "--rank", "4"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["tokens_per_s"]) == {"base", "one_adapter", "four_mixed"}
    assert report["targets"] == 10  # 2 layers x (Q, K, V, attention output, output): not the GELU-fused one
    assert all(v > 0 for v in report["tokens_per_s"].values())
