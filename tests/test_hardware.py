"""System presets (src/meshplan/presets/hardware/*.toml), the TOML loader and the cluster mesh.

Expected numbers are the datasheet figures quoted in the preset comments, with the arithmetic shown here so a
reader can check them without opening a PDF. FLOP/s are dense: NVIDIA's starred (sparse) figures are halved.
"""

from __future__ import annotations

import pytest

from meshplan.errors import SpecError
from meshplan.fields import MAX_LISTED
from meshplan.specs.hardware import PRECISIONS, Cluster, System, load_system, system_names
from meshplan.units import GiB, MiB

PRESETS = ("a100", "a100-40gb", "a800", "b200", "b300", "dgx1-v100", "gb200", "gb300", "gh200", "h100", "h100-96gb",
           "h100-meta-24k", "h100-pcie", "h20", "h200", "h800", "l40s", "mi250x", "mi300x", "mi325x", "mi355x",
           "rtx-pro-6000", "v100")


def test_system_names_lists_every_preset():
    assert system_names() == sorted(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads(name):
    system = load_system(name)
    assert isinstance(system, System)
    assert system.name == name
    acc, net = system.accelerator, system.network
    assert acc.source and system.source
    assert set(acc.peak_flops) <= set(PRECISIONS)
    assert acc.tdp_watts > 0 and acc.num_sms > 0
    # Sanity of orders of magnitude: HBM faster than NVLink, NVLink faster than the per-GPU NIC share.
    assert acc.hbm_bandwidth > acc.nvlink_bandwidth > net.scale_out_bandwidth
    assert 15 * GiB < acc.hbm_bytes < 300 * GiB  # the V100 SXM2 16GB exposes 15.8 GiB


@pytest.mark.parametrize("name", PRESETS)
def test_latencies_are_the_same_in_every_preset(name):
    # One α per tier everywhere (NCCL tuning.cc hwLat: NVLink ring Simple 3.4 us, NET ring 4.0-9.6 us),
    # so differences between presets come from bandwidths, not from inconsistent latency guesses.
    net = load_system(name).network
    assert net.scale_up_latency == pytest.approx(3e-6)
    assert net.scale_out_latency == pytest.approx(5e-6)
    assert all(t.latency == pytest.approx(5e-6) for t in net.tiers[1:])  # every tier beyond NVLink (N-tier presets)


# name -> dense bf16 FLOP/s per GPU, as quoted in the preset comments.
DENSE_BF16 = {
    "v100": 125e12,      # fp16 tensor peak (DGX-2 2 PFLOPS / 16); Volta has no bf16, the entry is a stand-in
    "dgx1-v100": 125e12,  # V100 datasheet SXM2 tensor performance 125 TFLOPS (fp16; bf16 is the stand-in)
    "a100-40gb": 312e12,  # A100 datasheet BF16 312 | 624*
    "a100": 312e12,      # same GA100 part
    "h100": 989e12,      # H100 datasheet (SXM) 1,979* / 2 = 989.5, quoted as 989
    "h100-96gb": 989e12,  # H100 SXM silicon peak, not derated for the 500 W cap
    "h100-meta-24k": 989e12,  # the H100 SXM of Meta's Llama 3 cluster
    "h200": 989e12,      # H200 datasheet (SXM) 1,979* / 2
    "b200": 2250e12,     # HGX B200 36 PFLOPS* / 8 GPUs / 2 = 2.25 PFLOPS
    "b300": 2250e12,     # HGX B300 36 PFLOPS* / 8 GPUs / 2 = 2.25 PFLOPS
    "gb200": 2500e12,    # GB200 NVL72 360 PFLOPS* / 72 GPUs / 2 = 2.5 PFLOPS
    "gb300": 2500e12,    # GB300 NVL72 360 PFLOPS* / 72 GPUs / 2 = 2.5 PFLOPS
    "a800": 312e12,      # A800 = A100 compute (NVLink cut to 400 GB/s)
    "h800": 989e12,      # H800 datasheet 1,979* / 2, as H100 SXM
    "h20": 148e12,       # H20: 148 dense
    "h100-pcie": 756e12,  # H100 PCIe 1,513* / 2
    "gh200": 989e12,     # GH200's Hopper GPU = H100 SXM peaks
    "l40s": 362e12,      # L40S datasheet 733* / 2 (rounded down in the sheet: 362.05)
    "mi250x": 191.5e12,  # per GCD: 1700 MHz x 110 CUs x 1024 FLOP/clk = 191.5 (383 per two-GCD package)
    "mi300x": 1307.4e12,  # 2100 MHz x 304 CUs x 2048 FLOP/clk = 1307.4
    "mi325x": 1307.4e12,  # same compute die as MI300X
    "mi355x": 2500e12,   # 5 PF with structured sparsity / 2
    "rtx-pro-6000": 500e12,  # RTX PRO 6000 Blackwell Server Edition page FP16/BF16 1 PFLOP* / 2
}


@pytest.mark.parametrize("name", PRESETS)
def test_dense_bf16_peak_matches_datasheet(name):
    assert load_system(name).accelerator.flops("bf16") == pytest.approx(DENSE_BF16[name])


def test_v100_tensor_peak_is_fp16_only():
    acc = load_system("v100").accelerator
    assert acc.flops("fp16") == pytest.approx(125e12)  # DGX-2: 2 PFLOPS / 16 GPUs = 125 TFLOP/s
    assert acc.flops("fp32") == pytest.approx(15.7e12)
    for missing in ("tf32", "fp8", "fp4"):  # Volta has none of these
        with pytest.raises(SpecError, match=missing):
            acc.flops(missing)


def test_fp16_falls_back_to_bf16_where_not_listed():
    acc = load_system("h100").accelerator
    assert acc.flops("fp16") == acc.flops("bf16")


@pytest.mark.parametrize(("name", "fp8"), [
    ("h100", 1979e12),   # 3,958* / 2
    ("h200", 1979e12),   # 3,958* / 2
    ("b200", 4500e12),   # DGX B200 72 PFLOPS FP8* / 8 GPUs = 9* / 2 = 4.5 PFLOPS
    ("b300", 4500e12),   # DGX B300 72 PFLOPS FP8* / 8 GPUs = 9* / 2 = 4.5 PFLOPS
    ("gb200", 5000e12),  # NVL72 720 PFLOPS* / 72 = 10* / 2 = 5 PFLOPS
    ("gb300", 5000e12),  # NVL72 720 PFLOPS* / 72 = 10* / 2 = 5 PFLOPS
    ("rtx-pro-6000", 1000e12),  # Server Edition page FP8 2 PFLOPS* / 2 = 1 PFLOPS
])
def test_dense_fp8_peak(name, fp8):
    acc = load_system(name).accelerator
    assert acc.flops("fp8") == pytest.approx(fp8)
    # FP8 tensor cores run at twice the bf16 rate on Hopper and Blackwell (989 x 2 = 1978 ~ 1979).
    assert acc.flops("fp8") == pytest.approx(2 * acc.flops("bf16"), rel=1e-3)


@pytest.mark.parametrize(("name", "fp4"), [
    ("b200", 9000e12),    # DGX B200 144 PFLOPS FP4* / 8 = 18* / 2 = 9 PFLOPS
    ("gb200", 10000e12),  # NVL72 1,440 PFLOPS* / 72 = 20* / 2 = 10 PFLOPS
    ("b300", 13500e12),   # DGX B300 FP4 108 PFLOPS dense / 8 = 13.5 PFLOPS ("Ultra": 1.5x B200's 9)
    ("gb300", 15000e12),  # NVL72 1,080 PFLOPS dense / 72 = 15 PFLOPS (1.5x GB200's 10)
    ("rtx-pro-6000", 2000e12),  # Server Edition page FP4 4 PFLOPS* / 2 = 2 PFLOPS
])
def test_dense_fp4_peak(name, fp4):
    assert load_system(name).accelerator.flops("fp4") == pytest.approx(fp4)


@pytest.mark.parametrize("name", ["v100", "dgx1-v100", "a100", "a100-40gb"])
def test_pre_hopper_parts_have_no_fp8(name):
    with pytest.raises(SpecError, match="fp8"):
        load_system(name).accelerator.flops("fp8")


@pytest.mark.parametrize("name", ["h100", "h100-96gb", "h200"])
def test_hopper_has_no_fp4(name):
    with pytest.raises(SpecError, match="fp4"):
        load_system(name).accelerator.flops("fp4")


@pytest.mark.parametrize(("name", "mib"), [
    ("h100", 81559),   # nvidia-smi on H100 80GB HBM3: 80 GiB = 81920 MiB minus the driver's reserve
    ("h200", 143771),  # "141GB" = 140.4 GiB exposed
    ("b200", 183359),  # "180GB" = 179.1 GiB exposed
    ("b300", 275040),  # marketed 288 GB, 268.6 GiB exposed
    ("a100", 81920),   # Ampere exposes the full 80 GiB
    ("rtx-pro-6000", 97887),  # "96 GB" GDDR7 with ECC: 95.6 GiB exposed
])
def test_hbm_capacity_is_what_the_driver_exposes(name, mib):
    assert load_system(name).accelerator.hbm_bytes == mib * MiB


def test_bandwidths_are_per_direction():
    # NVIDIA quotes NVLink bidirectionally: 900 GB/s (H100) -> 450; 1.8 TB/s (Blackwell) -> 900;
    # 600 GB/s (A100) -> 300.
    assert load_system("h100").accelerator.nvlink_bandwidth == pytest.approx(450e9)
    assert load_system("b200").accelerator.nvlink_bandwidth == pytest.approx(900e9)
    assert load_system("a100").accelerator.nvlink_bandwidth == pytest.approx(300e9)
    # the export variants: 400 GB/s bidirectional -> 200; MI300X: 7 Infinity Fabric links x 64 GB/s per direction
    assert load_system("h800").accelerator.nvlink_bandwidth == pytest.approx(200e9)
    assert load_system("a800").accelerator.nvlink_bandwidth == pytest.approx(200e9)
    assert load_system("mi300x").accelerator.nvlink_bandwidth == pytest.approx(7 * 64e9)
    # NICs are quoted in bits per direction: 400 Gb/s = 50 GB/s; DGX-2 has 8 x 100 Gb/s for 16 GPUs.
    assert load_system("h100").network.nic_bandwidth == pytest.approx(50e9)
    v100 = load_system("v100").network
    assert v100.nics_per_gpu * v100.nic_bandwidth == pytest.approx(0.5 * 12.5e9)


# ---- cluster meshes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "gpus", "shape"), [
    ("h100", 1024, (8, 128)),   # 1024 / 8 per DGX = 128 nodes
    ("h100", 8, (8, 1)),
    ("h100", 4, (4, 1)),        # a job smaller than a node uses part of one NVLink domain
    ("v100", 1024, (16, 64)),   # DGX-2: 16 GPUs per NVSwitch domain
    ("gb200", 144, (72, 2)),    # two NVL72 racks
    ("gb200", 72, (72, 1)),
    ("gb300", 576, (72, 8)),
    ("b300", 64, (8, 8)),
])
def test_cluster_mesh_shape(name, gpus, shape):
    cluster = load_system(name).cluster(gpus)
    assert cluster.mesh_shape == shape
    assert cluster.num_gpus == gpus
    assert cluster.nvlink_domain == shape[0]


def test_cluster_tier_bandwidths_come_from_the_preset():
    cluster = load_system("h100").cluster(16)
    nvlink, network = cluster.tiers
    assert nvlink.bandwidth == pytest.approx(450e9)
    assert network.bandwidth == pytest.approx(1 * 50e9)  # 1 NIC per GPU x 400 Gb/s
    assert (nvlink.latency, network.latency) == pytest.approx((3e-6, 5e-6))


def test_gpus_not_a_multiple_of_the_nvlink_domain_raises():
    # 1024 = 14 x 72 + 16: not a whole number of NVL72 racks.
    with pytest.raises(SpecError) as info:
        load_system("gb200").cluster(1024)
    message = str(info.value)
    assert "gpus=1024" in message and "72" in message


def test_cluster_nvlink_domain_override():
    # An 8-GPU part modelled as if it were in a 72-GPU NVLink domain: 144 / 72 = 2 domains.
    cluster = load_system("h100").cluster(144, nvlink_domain=72)
    assert cluster.mesh_shape == (72, 2)
    # The other way round: a GB200 rack split into 4-GPU trays (no multi-node NVLink): 144 / 4 = 36.
    assert load_system("gb200").cluster(144, nvlink_domain=4).mesh_shape == (4, 36)
    # The preset itself is unchanged.
    assert load_system("h100").cluster(144).mesh_shape == (8, 18)



@pytest.mark.parametrize("field, value", [("host_bandwidth", 0.5), ("host_memory", 0.0), ("host_memory", float("inf"))])
def test_cluster_built_directly_checks_host_fields_as_the_preset_does(field, value):
    # Calibration and tests build a Cluster without a Network: the same rule (at least 1 B or B/s, finite) applies.
    base = load_system("h100").cluster(8)
    kwargs = {"name": base.name, "accelerator": base.accelerator, "num_gpus": 8, "tiers": base.tiers, field: value}
    with pytest.raises(SpecError, match=f"{field}={value!r} must be at least 1 and finite"):
        Cluster(**kwargs)

# ---- loader errors ----------------------------------------------------------------------------------------
def test_unknown_preset_names_the_closest_and_where_all_are_listed():
    # more presets than fields.MAX_LISTED (21 > 20): the closest are named, and the command that lists them all
    with pytest.raises(SpecError) as info:
        load_system("h1000")
    assert len(PRESETS) > MAX_LISTED
    assert str(info.value) == ("system='h1000' is not a preset or a .toml file (did you mean h100 or v100 or h800? "
                               f"`meshplan presets` lists the {len(PRESETS)} presets)")


def test_malformed_toml_raises_one_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "broken"\n[accelerator\nnum_sms = 132\n')
    with pytest.raises(SpecError) as info:
        load_system(str(path))
    message = str(info.value)
    assert "malformed TOML" in message
    assert "\n" not in message


def test_missing_toml_file_raises(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_system(str(tmp_path / "absent.toml"))


def test_toml_file_in_preset_format_loads(tmp_path):
    # A user-supplied file in the preset format: a 4-GPU box, one 200 Gb/s NIC shared by all four.
    path = tmp_path / "mybox.toml"
    path.write_text(
        'name = "mybox"\n'
        "[accelerator]\n"
        'name = "test GPU"\nnum_sms = 100\nhbm_bytes = "48 GiB"\nhbm_bandwidth = "1 TB/s"\n'
        'nvlink_bandwidth = "100 GB/s"\n'
        '[accelerator.peak_flops]\nbf16 = "100 TFLOP/s"\n'
        "[network]\n"
        'nvlink_domain = 4\nnvlink_latency = "3 us"\nnics_per_gpu = 0.25\n'
        'nic_bandwidth = "200 Gb/s"\nnic_latency = "5 us"\n'
    )
    system = load_system(str(path))
    assert system.accelerator.hbm_bytes == 48 * GiB
    assert system.cluster(8).mesh_shape == (4, 2)
    assert system.cluster(8).tiers[1].bandwidth == pytest.approx(0.25 * 25e9)


def test_missing_required_field_raises(tmp_path):
    path = tmp_path / "nohbm.toml"
    path.write_text(
        "[accelerator]\n"
        'name = "x"\nhbm_bandwidth = "1 TB/s"\nnvlink_bandwidth = "100 GB/s"\n'
        '[accelerator.peak_flops]\nbf16 = "1 TFLOP/s"\n'
        "[network]\n"
        'nvlink_domain = 8\nnvlink_latency = "3 us"\nnics_per_gpu = 1\n'
        'nic_bandwidth = "400 Gb/s"\nnic_latency = "5 us"\n'
    )
    with pytest.raises(SpecError, match="hbm_bytes"):
        load_system(str(path))


@pytest.mark.parametrize("name", ["h100", "h200", "a100"])
def test_mxfp8_needs_block_scaled_tensor_cores(name):
    with pytest.raises(SpecError, match="mxfp8"):
        load_system(name).accelerator.flops("mxfp8")


def test_rtx_pro_6000_is_a_pcie_part_without_nvlink():
    """RTX PRO 6000 Blackwell Server Edition: GDDR7 at 1,597 GB/s (not the Workstation Edition's 1,792), 188 SMs
    (24,064 cores / 128), 600 W, mma.sync only (sm_120); GPU to GPU over PCIe Gen5 x16 at NCCL's rating
    16 lanes x 240 / 80 = 48 GB/s less the Intel peer overhead 6/5 = 40 GB/s, eight GPUs per server."""
    s = load_system("rtx-pro-6000")
    acc = s.accelerator
    assert acc.hbm_bandwidth == pytest.approx(1597e9) and acc.num_sms == 188 and acc.tdp_watts == 600
    assert acc.architecture == "blackwell" and acc.async_mma is False
    assert acc.nvlink_bandwidth == pytest.approx(16 * 240 / 80 * 1e9 / 1.2)
    assert s.network.nvlink_domain == 8


def test_a_preset_loaded_again_is_the_same_system_until_a_file_it_reads_changes(tmp_path, monkeypatch):
    """load_system keeps a preset's System by its resolved document (files.preset_spec): the same frozen object while
    a100.toml reads the same; its HBM edited from 81,920 to 40,960 MiB, built afresh (40,960 × 2^20 = 42,949,672,960 B),
    and so is a preset that extends it; the old text again gives the first System back."""
    import shutil  # noqa: PLC0415

    from meshplan import files  # noqa: PLC0415
    from meshplan.specs import hardware  # noqa: PLC0415

    root = tmp_path / "presets"
    shutil.copytree(files.PRESETS / "hardware", root / "hardware")
    monkeypatch.setattr(files, "PRESETS", root)
    monkeypatch.setattr(hardware, "PRESETS", root)
    (root / "hardware" / "mine.toml").write_text('extends = "a100"\nname = "mine"\n')
    a100, text = root / "hardware" / "a100.toml", (root / "hardware" / "a100.toml").read_text()
    first, derived = load_system("a100"), load_system("mine")
    assert load_system("a100") is first and load_system("mine") is derived
    assert first.accelerator.hbm_bytes == derived.accelerator.hbm_bytes == 81920 * MiB
    a100.write_text(text.replace('hbm_bytes = "81920 MiB"', 'hbm_bytes = "40960 MiB"', 1))
    assert load_system("a100").accelerator.hbm_bytes == load_system("mine").accelerator.hbm_bytes == 42_949_672_960
    a100.write_text(text)
    assert load_system("a100") is first and load_system("mine") is derived
