"""docs/cli.md is what ``poolgate.gateway.cli_docs`` renders from the parser now."""
from poolgate.gateway import cli_docs
from poolgate.gateway.cli import COMMANDS


def test_cli_page_is_current():
    assert cli_docs.PAGE.read_text(encoding="utf-8") == cli_docs.render(), (
        "docs/cli.md is stale: run python -m poolgate.gateway.cli_docs")


def test_every_subcommand_and_flag_is_on_the_page():
    text = cli_docs.render()
    parser = cli_docs.build_parser()
    for name, sub in cli_docs.subcommands(parser).items():
        assert name in COMMANDS
        assert f"## `poolgate {name}`" in text
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and action.help != "==SUPPRESS==":
                    assert f"`{option}" in text, (name, option)


def test_check_reports_a_stale_page(tmp_path, monkeypatch):
    page = tmp_path / "cli.md"
    page.write_text("old\n", encoding="utf-8")
    monkeypatch.setattr(cli_docs, "PAGE", page)
    assert cli_docs.main(["--check"]) == 1
    assert cli_docs.main([]) == 0
    assert cli_docs.main(["--check"]) == 0
