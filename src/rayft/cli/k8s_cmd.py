"""``rayft k8s render CONFIG --target ...``: Kubernetes manifests that run the config."""

from __future__ import annotations

from pathlib import Path

import click

from rayft import api
from rayft.cli.common import config_argument, load_cli_config, overrides_argument

_TARGETS = ("rayjob", "raycluster", "rayservice", "trainjob", "pytorchjob")


@click.group()
def k8s() -> None:
    """Kubernetes manifests (KubeRay, Kubeflow) rendered from a config."""


@k8s.command(epilog="Settings live in the config's k8s section: rayft config fields CONFIG | grep k8s.")
@config_argument
@overrides_argument
@click.option("--target", type=click.Choice(_TARGETS), default="rayjob", show_default=True,
              help="rayjob (KubeRay, a cluster per job), raycluster (KubeRay, for rayft submit), "
                   "trainjob (Kubeflow Trainer) or pytorchjob (Kubeflow training-operator).")  # fmt: skip
@click.option("--image", help="Container image with rayft installed (default: k8s.image).")
@click.option("--namespace", help="Namespace of every object (default: k8s.namespace).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              help="Write one file per object into this directory instead of printing them.")  # fmt: skip
@click.option(
    "--with-namespace", is_flag=True, help="Also render the Namespace, its ResourceQuota and the ServiceAccount."
)
def render(  # noqa: PLR0917 - click passes every option positionally by name
    config_path: str,
    overrides: tuple[str, ...],
    target: str,
    image: str | None,
    namespace: str | None,
    output: Path | None,
    with_namespace: bool,
) -> None:
    """Print (or write) the manifests that run `rayft <command> <config>` on Kubernetes.

    The resolved config goes into a ConfigMap mounted read-only at /etc/rayft/config.yaml; apply
    the output with `kubectl apply -f -` (or -f DIR with --output).
    """
    from rayft.deploy.writer import to_yaml, write_manifests

    extra = [f"k8s.image={image}"] * bool(image) + [f"k8s.namespace={namespace}"] * bool(namespace)
    cfg = load_cli_config(config_path, (*overrides, *extra))
    manifests = api.render_manifests(cfg, target, with_namespace=with_namespace)
    if output is None:
        click.echo(to_yaml(manifests), nl=False)
        return
    for path in write_manifests(manifests, output):
        click.echo(path)
