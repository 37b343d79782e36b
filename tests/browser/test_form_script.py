"""In real Chromium: the spawn form's script keeps each GPU count's reason in step with the chosen model.

The form is rendered as the hub renders it and opened as a page; picking a model re-marks
every count: free now, "not free now", or "never fits here" with why, for that model.
"""

from __future__ import annotations

from jinja2 import Environment, PackageLoader

from chromium import NEEDS_CHROMIUM
from gpuspawner.form import form_context
from gpuspawner.gpu import GPU
from gpuspawner.inventory import InventoryReading
from gpuspawner.profiles import load_profiles

pytestmark = [NEEDS_CHROMIUM]

A100, T4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"
PROFILES = load_profiles([{"slug": "gpu", "display_name": "GPU", "gpu_counts": [1, 2, 4], "default_gpus": 1,
                           "default": True}])
# h1: 2 A100 and a T4; h2: 4 A100, two of them held
GPUS = (GPU("h1", 0, "a", A100), GPU("h1", 1, "b", A100), GPU("h1", 2, "c", T4),
        *(GPU("h2", i, f"h2-{i}", A100) for i in range(4)))


def test_picking_a_model_re_marks_every_count(tmp_path, browser):
    form = Environment(loader=PackageLoader("gpuspawner", "templates"), autoescape=True).get_template(
        "form.html").render(**form_context(PROFILES, InventoryReading(GPUS), {"h2-0", "h2-1"}))
    page_file = tmp_path / "form.html"
    page_file.write_text(f"<!doctype html><meta charset=utf-8><form>{form}</form>")
    page = browser.new_page()
    page.goto(page_file.as_uri())

    def counts() -> list[tuple[str, bool]]:
        return [tuple(o) for o in page.eval_on_selector_all(
            "select[name=gpus-gpu] option", "options => options.map(o => [o.textContent, o.disabled])")]

    any_model = [("1 GPU", False), ("2 GPUs", False), ("4 GPUs (not free now)", True)]
    assert counts() == any_model
    page.select_option("select[name=gpu_model-gpu]", "t4")
    assert counts() == [("1 GPU", False),
                        ("2 GPUs (never fits here: needs 2 x Tesla T4 on one host; the largest here has 1)", True),
                        ("4 GPUs (never fits here: needs 4 x Tesla T4 on one host; the largest here has 1)", True)]
    page.select_option("select[name=gpu_model-gpu]", "any")
    assert counts() == any_model
    assert page.inner_text(".gs-free") == f"{A100}: 4 of 6 free · {T4}: 1 of 1 free"
