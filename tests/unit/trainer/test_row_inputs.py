"""row_inputs.to_device: a row's lists in one buffer per dtype, each back with its own shape."""

from __future__ import annotations

import torch

from agrpo.services.trainer.row_inputs import to_device


def test_each_list_comes_back_with_its_values_dtype_and_shape():
    grid = torch.arange(6).reshape(2, 3)
    out = to_device(torch.device("cpu"), {"ids": [5, 6, 7], "grid": grid, "none": []},
                    {"old": [-0.5, -1.25], "adv": [1.0]})
    assert out["ids"].tolist() == [5, 6, 7] and out["ids"].dtype == torch.long
    assert torch.equal(out["grid"], grid) and out["none"].shape == (0,)
    assert out["old"].tolist() == [-0.5, -1.25] and out["adv"].dtype == torch.float32
    assert out["ids"].untyped_storage().data_ptr() == out["grid"].untyped_storage().data_ptr()  # one buffer
    assert all(t.data_ptr() % 16 == 0 for t in out.values())  # every piece aligned


def test_no_floats_means_no_float_buffer():
    assert set(to_device(torch.device("cpu"), {"labels": [1]})) == {"labels"}
