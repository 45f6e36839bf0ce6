"""One registration per transport: the config's choices, the contract's enum and the factory
all read services/common/weight_transports.py."""

import pytest
import torch

from agrpo.services.common import weight_transports
from agrpo.services.common.config import ConfigError, load_config
from agrpo.services.common.preflight import StartupError
from agrpo.services.trainer.setup import make_transport
from agrpo.services.trainer.weight_sync.base import WeightTransport
from agrpo.v1 import common_pb2


@pytest.mark.parametrize("name", weight_transports.NAMES)
def test_every_registered_transport_is_whole(name):
    cls = weight_transports.load(name)
    assert issubclass(cls, WeightTransport) and cls.name == name
    assert common_pb2.WeightTransport.Value(weight_transports.proto_name(name)) > 0  # in the contract
    assert load_config(["--trainer.weight_transport", name], {}).trainer.weight_transport == name


def test_the_factory_builds_the_named_one_and_refuses_a_gpu_one_on_a_cpu(tmp_path):
    cfg = load_config(["--trainer.weight_transport", "shared_path", "--output_dir", str(tmp_path)], {})
    transport = make_transport(cfg, torch.device("cpu"))
    assert transport.name == "shared_path" and transport.snapshot and transport.in_band
    assert make_transport(load_config([], {}), torch.device("cpu")).name == "http"  # auto on a CPU
    with pytest.raises(StartupError, match="needs the trainer on a GPU"):
        make_transport(load_config(["--trainer.weight_transport", "nccl"], {}), torch.device("cpu"))
    with pytest.raises(ConfigError, match="weight_transport"):
        load_config(["--trainer.weight_transport", "carrier_pigeon"], {})
