"""``graphflow cluster up|down|status|stop-node|start-node``: a multi-node Ray cluster of
network namespaces on this machine (``graphflow.harness.cluster``), for development and tests."""

from __future__ import annotations

from dataclasses import asdict

import typer

from graphflow.cli._common import emit, out, say, user_errors

app = typer.Typer(
    help=(
        "A multi-node Ray cluster on this machine: one network namespace per node, each with its own PID, IPC "
        "and mount namespaces, so replicas of one node share memory and nodes talk over shaped links (needs root)."
    ),
    no_args_is_help=True,
)


@app.command("up")
@user_errors
def up(
    nodes: int = typer.Option(3, help="Ray nodes (one namespace each; node 0 is the head)."),
    link: str = typer.Option(
        "", help="Link rates: '1gbit' for every pair, or per pair '0-1=10gbit,0-2=200mbit' ('' = unshaped)."
    ),
    delay_ms: float = typer.Option(0.0, "--delay-ms", help="One-way delay added on every node's egress."),
    cpus: int = typer.Option(2, help="Ray CPUs each node offers."),
    no_ray: bool = typer.Option(
        False, "--no-ray", help="Only the namespaces and links; start Ray yourself (e.g. deploy/slurm with stand-ins)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Create the namespaces, bridge and shaped links; start the Ray head and workers (each
    node's Ray in PID, IPC and mount namespaces of its own, its log in the node's /tmp/ray)."""
    from graphflow.harness.cluster import ClusterSpec, cluster_up, parse_links

    default, pairs = parse_links(link)
    cluster = cluster_up(ClusterSpec(nodes, default, pairs, delay_ms, cpus), say=say, start_ray=not no_ray)
    if json_out:
        emit({**cluster.to_json(), "ray_started": not no_ray})
        return
    if no_ray:
        names = ", ".join(f"{n.namespace} ({n.address})" for n in cluster.nodes)
        out.print(f"{nodes} namespaces up, no Ray started: {names}")
        return
    out.print(f"{nodes} Ray nodes up; head {cluster.head_address}")
    out.print(f"from this namespace: graphflow serve --address {cluster.client_address} --spread")


@app.command("down")
@user_errors
def down(json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line.")) -> None:
    """Stop every process in the cluster's namespaces and remove them, their links and the bridge."""
    from graphflow.harness.cluster import cluster_down

    removed = cluster_down()
    if json_out:
        emit(asdict(removed))
    else:
        out.print(f"removed {removed.namespaces} namespaces, {removed.processes} processes")


@app.command("stop-node")
@user_errors
def stop(
    node: int = typer.Argument(..., help="The worker node to kill (1 or more)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Kill a worker node's raylet and every process in its namespace (a crashed machine)."""
    from graphflow.harness.cluster import stop_node

    killed = stop_node(node)
    if json_out:
        emit({"node": node, "processes": killed})
    else:
        out.print(f"node {node} stopped ({killed} processes killed)")


@app.command("start-node")
@user_errors
def start(
    node: int = typer.Argument(..., help="The worker node to start again."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Start a stopped worker node's Ray again; it rejoins the head."""
    from graphflow.harness.cluster import start_node

    start_node(node)
    if json_out:
        emit({"node": node, "started": True})
    else:
        out.print(f"node {node} started")


@app.command("status")
@user_errors
def status(json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line.")) -> None:
    """What `cluster up` started, if it still runs."""
    from graphflow.harness.cluster import running_cluster

    state = running_cluster()
    if json_out:
        emit({"running": state is not None, **(state.to_json() if state else {})})
    elif state is None:
        out.print("no namespace cluster is running (start one with `graphflow cluster up`)")
    else:
        out.print(f"running: head {state.head_address}, client {state.client_address}")
