"""The MPS control daemon's Deployment judged by the real kube-apiserver 1.37.2: made,
read, listed and deleted by the plugin's own client as the chart's ServiceAccount, under
the Role the chart renders with `nvidia.mps.enabled` (its own namespace only), and the
Deployment as the plugin writes it passes the server's validation."""

from __future__ import annotations

import asyncio

import pytest

from dra_plugin.kubeapi import KubeAPI
from dra_plugin.running.workloads import LoopWorkloads
from dra_plugin.vendors.nvidia import mpsdaemon
from dra_plugin.vendors.nvidia.mpsdaemon import DaemonLimits, DaemonSpec
from dra_plugin.vendors.workloads import WorkloadError
from fakes.judges.apiserver import ApiServer
from tests.judges.chart_identity import Chart, PluginAccess, render_chart

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

UUID = "GPU-00000000-aaaa-4bbb-8ccc-000000000000"


def test_daemon_deployment_with_the_charts_role(
    judge_api: ApiServer, judge_chart: Chart, judge_node: PluginAccess
) -> None:
    rendered = render_chart(values={"nvidia": {"mps": {"enabled": True}}})
    for obj in rendered:
        if obj["kind"] in ("Role", "RoleBinding"):
            obj["metadata"].setdefault("namespace", judge_chart.namespace)
            judge_api.create(obj)
    spec = DaemonSpec(
        key="11111111-0000-4000-8000-000000000001",
        namespace=judge_chart.namespace,
        node=judge_node.node,
        driver="gpu.nvidia.com",
        image="dra-plugin:judge",
        driver_root="/run/nvidia/driver",
        gpus=(UUID,),
        pipe_dir="/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/pipe",
        log_dir="/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/log",
        shm_dir="/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/shm",
        limits=DaemonLimits(50, {UUID: 2**30}),
    )
    selector = mpsdaemon.node_selector(judge_node.node, "gpu.nvidia.com")

    async def go() -> None:
        api = KubeAPI.from_kubeconfig(str(judge_node.kubeconfig))
        mine = LoopWorkloads(api, asyncio.get_running_loop(), judge_chart.namespace, "n")
        other = LoopWorkloads(api, asyncio.get_running_loop(), "default", "n")

        def create() -> bool:
            return mine.create_deployment(mpsdaemon.deployment(spec))

        for _ in range(150):  # RBAC takes effect when the server's informer sees the Role
            try:
                await asyncio.to_thread(mine.list_deployments, selector)
                break
            except WorkloadError:
                await asyncio.sleep(0.2)
        assert await asyncio.to_thread(create) is True
        assert await asyncio.to_thread(create) is False  # exists: made by an earlier pass
        got = await asyncio.to_thread(mine.get_deployment, spec.name)
        assert got is not None
        assert got["spec"]["template"]["spec"]["nodeName"] == judge_node.node  # type: ignore[index]
        listed = await asyncio.to_thread(mine.list_deployments, selector)
        assert [d["metadata"]["name"] for d in listed] == [spec.name]  # type: ignore[index]
        assert await asyncio.to_thread(mine.list_pods, selector) == []  # no controller here
        # Least privilege: nothing outside the plugin's namespace.
        with pytest.raises(WorkloadError, match=r"403|forbidden|Forbidden"):
            await asyncio.to_thread(other.list_deployments, selector)
        with pytest.raises(WorkloadError, match=r"403|forbidden|Forbidden"):
            await asyncio.to_thread(other.create_deployment, mpsdaemon.deployment(spec))
        await asyncio.to_thread(mine.delete_deployment, spec.name)
        await asyncio.to_thread(mine.delete_deployment, spec.name)  # gone: nothing to do
        assert await asyncio.to_thread(mine.get_deployment, spec.name) is None
        await api.close()

    asyncio.run(go())
