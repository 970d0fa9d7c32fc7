from graphflow.cli.serve import client_address


def test_the_client_address_is_the_heads_ray_client_port():
    assert client_address("10.233.0.1:6379") == "ray://10.233.0.1:10001"
    assert client_address("127.0.0.1:6380") == "ray://127.0.0.1:10001"
    assert client_address("ray://head:10001") == "ray://head:10001"
