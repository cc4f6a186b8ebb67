"""Start-up check: does containerd read the directory this plugin writes CDI specs to?

If it does not, every pod with a claim fails in the runtime ("unresolvable CDI devices")
long after prepare succeeded. Talos 1.13+ turns CDI on with only /run/cdi listed, while
our default CDI root is /var/cdi/dynamic, so this is checked once at start: one error
with the exact fix for this node, and a gauge for alerting.
"""

from __future__ import annotations

import logging

from dra_plugin.config import Config
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.host import containerd
from dra_plugin.host.hostview import Host
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)
CHECK = "containerd-cdi"


def check_cdi_root_listed(cfg: Config) -> Finding | None:
    """PASS or FAIL (with the fix) for cfg.cdi_root; None when it cannot be told.

    None: no containerd config is visible under cfg.host_root (the host's / is not
    mounted into the pod, or the node runs another runtime).
    """
    host = Host(cfg.host_root)
    state = containerd.read(host)
    if not state.files:
        return None
    talos = host.is_talos()
    root = str(cfg.cdi_root)
    if state.errors:
        path, err = state.errors[0]
        return Finding(Status.WARN, CHECK, f"cannot parse {path}: {err}; CDI dirs unknown")
    enabled, listed = state.enabled(talos), state.lists(root)
    if enabled and listed:
        return Finding(Status.PASS, CHECK, f"containerd reads CDI specs from {root}")
    why = []
    if not enabled:
        why.append("CDI is disabled")
    if not listed:
        default = " (default)" if state.dirs is None else ""
        why.append(f"it reads CDI specs only from {', '.join(state.effective_dirs)}{default}")
    fix = containerd.add_dir_fix(state, root, talos)
    return Finding(
        Status.FAIL,
        CHECK,
        f"containerd will not find the CDI specs this plugin writes to {root}: "
        f"{' and '.join(why)} ({state.source}); pods using claims will fail to start",
        fix.action,
        fix.detail,
    )


def announce_cdi_root(cfg: Config) -> Finding | None:
    """Run the check once at start: log it (one error when it fails) and set the gauge."""
    try:
        finding = check_cdi_root_listed(cfg)
    except OSError as exc:  # an unreadable host file must not stop the plugin
        log.warning("cannot check containerd's CDI dirs error=%s", exc)
        return None
    if finding is None:
        log.info(
            "containerd config not visible under host_root=%s; CDI root %s not checked "
            "(run `dra-plugin doctor` with the host mounted)",
            cfg.host_root,
            cfg.cdi_root,
        )
        return None
    if finding.status is Status.WARN:
        log.warning("%s", finding.found)
        return finding
    metrics.set_cdi_root_listed(str(cfg.cdi_root), finding.status is Status.PASS)
    if finding.status is Status.FAIL:
        log.error("%s. Fix: %s:\n%s", finding.found, finding.action, finding.detail.rstrip())
    else:
        log.info("%s", finding.found)
    return finding
