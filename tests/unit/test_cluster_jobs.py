"""Addresses, the plan of a rayft Ray Job, the job's entry checks, and the probes against servers
that are not Ray heads (no Ray started)."""

from __future__ import annotations

import http.server
import shlex
import threading
import time
from collections.abc import Iterator

import click
import pytest

from rayft.cli.job_entry import missing_env
from rayft.cluster.job_plan import JobRequest, exit_code, plan_job
from rayft.errors import ClusterError, ConfigError
from rayft.runtime.address import parse_address
from tests.support.servers import free_port, free_ports


@pytest.mark.parametrize(
    ("text", "kind", "host_port"),
    [
        ("auto", "auto", None),
        ("10.0.0.5:6379", "gcs", ("10.0.0.5", 6379)),
        ("head.example.org:6380", "gcs", ("head.example.org", 6380)),
        ("http://10.0.0.5:8265/", "jobs", ("10.0.0.5", 8265)),
        ("https://ray.example.org", "jobs", ("ray.example.org", 443)),
        ("ray://10.0.0.5:10001", "client", ("10.0.0.5", 10001)),
    ],
)
def test_address_forms(text: str, kind: str, host_port: tuple[str, int] | None) -> None:
    address = parse_address(text)
    assert address.kind == kind and address.host_port == host_port
    assert not address.text.endswith("/")


@pytest.mark.parametrize("text", ["localhost", "10.0.0.5:99999", "ftp://head:21", "http://", "head:port"])
def test_an_unknown_address_form_is_refused_with_the_known_ones(text: str) -> None:
    with pytest.raises(ConfigError, match=r"(not a Ray address\. Use 'auto'|port must be between)"):
        parse_address(text)


def _request(**changes: object) -> JobRequest:
    base: dict[str, object] = {"command": "train", "run_name": "my run/1", "rayft_version": "1.2.3"}
    return JobRequest(**{**base, **changes})  # type: ignore[arg-type]


def test_a_job_pins_the_installed_rayft_and_passes_credential_names_only() -> None:
    plan = plan_job(_request(env_names=("HF_TOKEN", "WANDB_API_KEY"), stop_grace_s=120), token="abcd1234")
    assert plan.submission_id == "rayft-train-my-run-1-abcd1234"
    assert shlex.split(plan.entrypoint) == [
        "python", "-m", "rayft.cli.job_entry", "--config-module", "rayft_job_abcd1234",
        "--require-env", "HF_TOKEN", "--require-env", "WANDB_API_KEY", "--", "train",
    ]  # fmt: skip
    assert plan.runtime_env == {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "150"}, "pip": ["rayft==1.2.3"]}
    assert plan.metadata["rayft_run"] == "my run/1" and plan.metadata["rayft_source"] == "pip rayft==1.2.3"


def test_a_job_with_a_working_dir_ships_the_local_source_and_resumes() -> None:
    request = _request(resume=True, working_dir="/src/project", source_dir="/src/project/src/rayft")
    plan = plan_job(request, token="t")
    assert plan.runtime_env["working_dir"] == "/src/project"
    assert plan.runtime_env["py_modules"] == ["/src/project/src/rayft"] and "pip" not in plan.runtime_env
    assert shlex.split(plan.entrypoint)[-2:] == ["train", "--resume"]
    data = plan_job(_request(command="data-prepare", extra_args=("--in-process",)), token="t")
    assert shlex.split(data.entrypoint)[-4:] == ["--", "data", "prepare", "--in-process"]


def test_bad_job_requests_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"--resume continues a training run; `rayft sdg` has none"):
        plan_job(_request(command="sdg", resume=True))
    with pytest.raises(ConfigError, match=r"--env 'HF_TOKEN=hf_abc': not an environment variable name"):
        plan_job(_request(env_names=("HF_TOKEN=hf_abc",)))
    with pytest.raises(ConfigError, match=r"--command 'serve': not a rayft command"):
        plan_job(_request(command="serve"))


def test_the_exit_status_follows_the_job() -> None:
    assert exit_code("SUCCEEDED", 0) == 0
    assert exit_code("STOPPED", None) == 143
    assert exit_code("FAILED", 2) == 2 and exit_code("FAILED", None) == 1


def test_the_entry_names_the_credentials_missing_on_the_cluster() -> None:
    assert missing_env(["A", "B", "C"], {"A": "x", "B": ""}) == ["B", "C"]


def test_a_jobs_url_on_a_joining_command_runs_it_as_a_job_with_its_options() -> None:
    from rayft.cli.address_opt import option_args

    @click.command()
    @click.option("--seeds", type=int)
    @click.option("--test-mode", is_flag=True)
    @click.option("--model", multiple=True)
    @click.option("--output", default=None)
    def command(**_: object) -> None:
        pass

    with click.Context(command):
        args = option_args({"seeds": 5, "test_mode": True, "model": ("a=x", "b=y"), "output": None})
    assert args == ("--seeds", "5", "--test-mode", "--model", "a=x", "--model", "b=y")


@pytest.fixture
def plain_http() -> Iterator[str]:
    """An HTTP server that is not a Ray dashboard (it answers 404 to everything)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_probes_name_the_address_and_the_fix_within_seconds(plain_http: str) -> None:
    from rayft.runtime.probe import check_gcs, check_jobs_api

    closed = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ClusterError, match=rf"--address {closed}: no Ray head answered .*ray start --head"):
        check_gcs(closed)
    with pytest.raises(ClusterError, match=rf"--address http://{closed}: cannot reach the Ray Jobs API .*ray start"):
        check_jobs_api(f"http://{closed}")
    with pytest.raises(ClusterError, match=r"does not serve Ray's Jobs API .*ray\[default\]"):
        check_jobs_api(f"http://{plain_http}")
    with pytest.raises(ClusterError, match=rf"--address {plain_http}: this is an HTTP server, not a Ray head's GCS"):
        check_gcs(plain_http)
    assert time.monotonic() - started < 10


def test_a_test_nodes_ports_are_distinct_and_outside_its_worker_range() -> None:
    """Ray refuses to start a node whose two components were given one port ("is trying to use a port
    number ... that is used by other components"), or one inside its worker port range."""
    workers = range(40000, 50000)
    ports = free_ports(64, outside=workers)
    assert len(set(ports)) == 64
    assert not [port for port in ports if port in workers]


class _RefusingJobs:
    """Stands in for Ray's JobSubmissionClient inside rayft's wrapper of it: refuses the first ``refusals``
    submissions with the error Ray's SDK raises for a refused request."""

    def __init__(self, refusals: int, message: str) -> None:
        self.refusals, self.message, self.calls = refusals, message, 0

    def submit_job(self, **_: object) -> str:
        self.calls += 1
        if self.calls <= self.refusals:
            raise RuntimeError(f"Request failed with status code 500: {self.message}.")
        return "raysubmit_x"


def test_a_submission_waits_for_the_heads_job_agent_then_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from rayft.cluster import jobs

    url = "http://127.0.0.1:8265"

    def serve(ray_client: _RefusingJobs) -> None:
        monkeypatch.setattr(jobs, "client", lambda _: jobs._Refusals(url, ray_client))

    no_agent = "No available agent to submit job, please try again later."
    late = _RefusingJobs(2, no_agent)
    serve(late)
    jobs._submit_job(url, wait_s=5, poll_s=0.01, entrypoint="true")
    assert late.calls == 3  # the agent came up: the job went in
    serve(_RefusingJobs(10**6, no_agent))
    with pytest.raises(ClusterError, match=r"has had no job agent for 0 s .*submit again") as refused:
        jobs._submit_job(url, wait_s=0.05, poll_s=0.01, entrypoint="true")
    assert "\n" not in str(refused.value)
    # Any other refusal, a server-side traceback in its body included, is one line at once.
    serve(_RefusingJobs(1, "Invalid runtime_env\nTraceback (most recent call last):\n  File ..."))
    with pytest.raises(ClusterError, match=r"^the Ray Jobs API at \S+ refused the request: .*Invalid runtime_env$"):
        jobs._submit_job(url, wait_s=5, poll_s=0.01, entrypoint="true")
