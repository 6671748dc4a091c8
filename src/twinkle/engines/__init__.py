"""Inference engines for the flow layer: concurrent start-up, port reservation, adapters.

``EnginePool`` starts independent engines at once (no global lock around a whole
initialisation); ``PortRegistry`` serialises only the choice of ports, host-wide, so
concurrent starts cannot collide. ``vllm_engine_factory`` runs vLLM servers (needs the
``twinkle[vllm]`` extra; vLLM itself is only imported in the engine processes);
``VllmClient`` talks to one over HTTP and ``VllmWeightPublisher`` publishes weights to them.
"""

from twinkle.engines._subprocess import (
    ReadyCheck,
    SubprocessEngine,
    launch_subprocess,
    wait_for_line,
)
from twinkle.engines.pool import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    Engine,
    EngineFactory,
    EnginePool,
    EngineShutdownTimeout,
    EngineStartCancelled,
    EngineStartTimeout,
    StartContext,
)
from twinkle.engines.ports import (
    DEFAULT_PORT_RANGE,
    PortClaim,
    PortRegistry,
    PortReservationError,
    Reservation,
)
from twinkle.engines.vllm import (
    VllmConfig,
    VllmEngine,
    VllmNotInstalledError,
    VllmPorts,
    vllm_engine_factory,
)
from twinkle.engines.vllm_client import (
    Completion,
    VllmClient,
    VllmHttpError,
    VllmReloadError,
    family_of,
    parse_prometheus_text,
)
from twinkle.engines.weights import (
    VllmPublishError,
    VllmWeightPublisher,
    prune_versions,
    publish_safetensors,
    published_versions,
)

__all__ = [
    "Completion",
    "DEFAULT_PORT_RANGE",
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "Engine",
    "EngineFactory",
    "EnginePool",
    "EngineShutdownTimeout",
    "EngineStartCancelled",
    "EngineStartTimeout",
    "PortClaim",
    "PortRegistry",
    "PortReservationError",
    "ReadyCheck",
    "Reservation",
    "StartContext",
    "SubprocessEngine",
    "VllmClient",
    "VllmConfig",
    "VllmEngine",
    "VllmNotInstalledError",
    "VllmHttpError",
    "VllmPorts",
    "VllmPublishError",
    "VllmReloadError",
    "VllmWeightPublisher",
    "launch_subprocess",
    "family_of",
    "parse_prometheus_text",
    "prune_versions",
    "publish_safetensors",
    "published_versions",
    "vllm_engine_factory",
    "wait_for_line",
]
