"""Retake README's screenshot (docs/screenshot.png): four method panels after one short run, and the
charts, in Debian's chromium.

    .venv/bin/python app.py --port 7861 &        # wait for "Running on ..." and a minute for its timing
    .venv/bin/python scripts/screenshot.py http://127.0.0.1:7861/ docs/screenshot.png

Take it on a machine where the app leaves a core to the browser (served on 127.0.0.1, the default),
so that the browser's redrawing does not slow the steps it shows.
"""
import shutil, sys
from playwright.sync_api import sync_playwright, expect

METHODS = ("autoregressive", "prompt_lookup", "eagle", "mixture")
url, out = sys.argv[1], sys.argv[2]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-quic", "--disable-sync"]
with sync_playwright() as p:
    b = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
    page = b.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(url)
    prompt = page.locator("#prompt textarea")
    expect(prompt).to_be_visible(timeout=120_000)
    prompt.fill("Repeat this list, then add one item: apples, pears, plums, cherries, grapes.")
    for box in page.locator("[id^=use-] input[type=checkbox]").all():
        if box.is_enabled() and box.is_checked():
            box.uncheck()
    for m in METHODS:
        page.locator(f"#use-{m} input[type=checkbox]").check()
    page.get_by_text("Generation settings", exact=True).click()
    max_new = page.locator("#gen-max_new_tokens input[type=number]")
    for _ in range(3):
        max_new.fill("48"); max_new.press("Enter")
        try:
            expect(max_new).to_have_value("48", timeout=10_000); break
        except AssertionError:
            continue
    page.get_by_text("Generation settings", exact=True).click()
    page.locator("#run").click()
    expect(page.locator("#status")).to_contain_text("Done", timeout=400_000)
    expect(page.locator("#chart .js-plotly-plot").first).to_be_visible(timeout=60_000)
    page.wait_for_timeout(1500)
    top_box, end_box = page.locator("#legend").bounding_box(), page.locator("#bars").bounding_box()
    full = out + ".full.png"
    page.screenshot(path=full, full_page=True)
    from PIL import Image
    im = Image.open(full)
    top = max(0, int(top_box["y"]) - 10)
    im.crop((0, top, im.width, min(im.height, int(end_box["y"] + end_box["height"]) + 10))).save(out, optimize=True)
    b.close()
