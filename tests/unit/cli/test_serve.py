from graphflow.cli.serve import client_address


def test_the_client_address_is_the_heads_ray_client_port():
    assert client_address("10.233.0.1:6379") == "ray://10.233.0.1:10001"
    assert client_address("127.0.0.1:6380") == "ray://127.0.0.1:10001"
    assert client_address("ray://head:10001") == "ray://head:10001"


def test_min_nodes_is_checked_before_anything_starts():
    from typer.testing import CliRunner

    from graphflow.cli import app

    runner = CliRunner()
    local = runner.invoke(app, ["serve", "--min-nodes", "3", "--detach"])
    assert local.exit_code == 2 and "--min-nodes above 1 needs --address" in local.output
    negative = runner.invoke(app, ["serve", "--address", "ray://h:10001", "--min-nodes", "-1"])
    assert negative.exit_code == 2 and "--min-nodes must be 0 or more, got -1" in negative.output
