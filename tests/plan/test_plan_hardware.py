"""The hardware catalog: headline system ratios from specs alone, citations, names, overrides."""
import pytest
import yaml

from forge.errors import ForgeError
from forge.plan.hardware import PACKAGE_CATALOG, get_system, known_targets, load_catalog, parse_targets, system_totals

CHIP_FIELDS = ("peak_tflops", "hbm_gb", "hbm_tbps", "link_GBps", "link_latency_us", "chip_w",
               "system_w_per_chip", "matmul_efficiency")
SYSTEM_FIELDS = ("chips_per_instance", "scale_up_chips", "scale_up_GBps", "scale_up_latency_us",
                 "scale_out_GBps", "scale_out_latency_us", "price")


def test_trn3_ultraserver_is_4_4x_trn2_ultraserver_fp8_compute():
    trn3 = system_totals(get_system("trn3-ultraserver"), precision="fp8")
    trn2 = system_totals(get_system("trn2-ultraserver"), precision="fp8")
    assert trn3["chips"] == 144 and trn2["chips"] == 64
    assert trn3["peak_pflops"] == pytest.approx(362, rel=0.01)       # AWS: 362 FP8 PFLOPS
    assert trn2["peak_pflops"] == pytest.approx(83.2, rel=0.01)      # AWS: 83.2 FP8 PFLOPS
    assert trn3["peak_pflops"] / trn2["peak_pflops"] == pytest.approx(4.4, abs=0.05)


def test_trn3_ultraserver_has_3_8_to_4x_the_memory_bandwidth():
    trn3 = system_totals(get_system("trn3"))
    trn2 = system_totals(get_system("trn2"))
    assert trn3["hbm_tbps"] == pytest.approx(705.6)
    assert 3.8 <= trn3["hbm_tbps"] / trn2["hbm_tbps"] <= 4.0


def test_trainium4_is_flagged_a_projection_with_announced_ratios():
    trn4, trn3 = get_system("trn4").chip, get_system("trn3").chip
    assert trn4.status == "projection"
    assert trn4.peak_flops("fp8") / trn3.peak_flops("fp8") == pytest.approx(3)
    assert trn4.peak_flops("fp4") / trn3.peak_flops("fp4") == pytest.approx(6)
    assert trn4.hbm_tbps / trn3.hbm_tbps == pytest.approx(4)


def test_every_number_cites_a_source():
    raw = yaml.safe_load(PACKAGE_CATALOG.read_text())
    refs = raw["references"]
    for key, chip in raw["chips"].items():
        for f in CHIP_FIELDS:
            assert chip["cite"][f] in refs, (key, f)
    for key, system in raw["systems"].items():
        for f in SYSTEM_FIELDS:
            assert system["cite"][f] in refs, (key, f)
        price = system["price"]
        assert price["source"] and price["date"] and price["kind"] in ("published", "derived", "estimate", "projection")


def test_expected_targets_exist():
    names = known_targets()
    for expected in ("trn3-ultraserver", "trn3-ultraserver-gen1", "trn2.48xlarge", "trn2-ultraserver",
                     "trn4-ultraserver", "p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "local"):
        assert expected in names
    assert get_system("trn3-ultraserver-gen1").default_chips == 64
    assert get_system("h200").chip.name.startswith("NVIDIA H200")


def test_bad_target_lists_the_known_ones():
    with pytest.raises(ForgeError) as err:
        get_system("trn9-megaserver")
    assert "trn9-megaserver" in str(err.value)
    for name in ("trn3-ultraserver", "p5.48xlarge", "local", "h100"):
        assert name in str(err.value)


def test_user_file_overrides_and_extends(tmp_path, monkeypatch):
    user = tmp_path / "mine.yaml"
    user.write_text(yaml.safe_dump({
        "systems": {"p5.48xlarge": {"price": {"usd_per_chip_hour": 3.0, "source": "our rate", "date": "2026-01-01",
                                              "kind": "negotiated"}},
                    "my-h100-pod": {"chip": "h100", "chips_per_instance": 8, "scale_up_chips": 8, "default_chips": 32,
                                    "scale_up_GBps": 900, "scale_up_latency_us": 2, "scale_out_GBps": 50,
                                    "scale_out_latency_us": 10, "price": {"usd_per_chip_hour": 2.5}}}}))
    monkeypatch.setenv("FORGE_HARDWARE_FILE", str(user))
    assert get_system("h100").usd_per_chip_hour == 3.0
    assert get_system("h100").chip.peak_flops("bf16") == 989e12         # untouched fields kept
    assert get_system("my-h100-pod").default_chips == 32
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"chips": {"h100": {"matmul_efficiency": {"bf16": 0.5}}}}))
    assert get_system("h100", load_catalog((extra,))).chip.default_efficiency("bf16") == 0.5


def test_parse_targets():
    assert parse_targets("trn3, trn2-ultraserver,h100:64") == [("trn3", None), ("trn2-ultraserver", None), ("h100", 64)]
    with pytest.raises(ForgeError):
        parse_targets("h100:lots")


def test_unknown_precision_is_a_clear_error():
    with pytest.raises(ForgeError, match="known: bf16"):
        get_system("trn2").chip.peak_flops("fp4")
