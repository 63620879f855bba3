#!/usr/bin/python3
"""Write tests/eval/everyday.jsonl: hand-written `cedar eval` tasks in the words a person types
at `cedar run` — real file and note names (app.conf, invoices/march.csv, wifi), everyday
phrasings, the default system prompt and every built-in tool offered, as `cedar run` does.

The generated splits (make_eval_tasks.py) draw made-up names (steamgolshex.conf) from the data
generator's pools; these tasks check that the shipped model carries over to the names and
requests of the README's users. Every file stem, folder and note key below is one of
data.EVERYDAY_NAMES, which the generator's real names (make_sample(..., real_names=P)) never
draw (tests/reference/test_data.py checks it); the requests are what people type, so some read
like train templates ("What time is it?") — the names are what is new.

Deterministic: the same file every run.  /usr/bin/python3 model/reference/make_everyday_tasks.py
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cedar_ref.expect import expect_of  # noqa: E402

TOOLS = ["calculator", "notes_save", "notes_read", "clock", "file_read", "file_list"]
CLOCK = "2029-09-25 12:57 (Tuesday)"

# Every file stem, folder and note key below is in data.EVERYDAY_NAMES (kept out of training).


def task(i, family, turns, expect, files=None, notes=None):
    t = {"id": f"everyday-{i:02d}-{family}", "family": family, "tools": TOOLS, "clock": CLOCK,
         "turns": turns if isinstance(turns, list) else [turns]}
    if files:
        t["files"] = files
    if notes:
        t["notes"] = notes
    t["expect"] = expect if isinstance(expect, dict) else expect_of(str(expect))
    return t


APP = "name = cedar\nversion = 3.2.1\nport = 8443\nworkers = 4"
DB = "host = localhost\nport = 5432\nuser = admin\ntimeout = 30"
PRICES = "apples: 3\npears: 5\nlemons: 2\ncherries: 12"
INVOICES = "acme: 1250\nglobex: 980\ninitech: 4310"


def tasks():
    out = []
    add = lambda family, turns, expect, **k: out.append(task(len(out), family, turns, expect, **k))
    # arithmetic
    add("calc", "How much is 48 times 52?", 2496)
    add("calc", "What is (17 + 5) * 3?", 66)
    add("calc", "Divide 1764 by 36.", 49)
    add("calc", "Add up 129, 348 and 77.", 554)
    add("calc", "what's 7 squared minus 9", 40)
    add("calc", "I have 3 boxes of 24 pens. How many pens is that in total?", 72)
    # the clock
    add("clock", "What time is it?", "12:57")
    add("clock", "What's today's date?", "2029-09-25")
    add("clock", "What day of the week is it?", "Tuesday")
    # files
    add("file", "What's in app.conf?", 8443, files={"app.conf": APP})
    add("file", "Which port does app.conf use?", 8443, files={"app.conf": APP})
    add("file", "How many workers are set in app.conf?", 4, files={"app.conf": APP})
    add("file", "What user is configured in config/database.conf?", "admin",
        files={"config/database.conf": DB})
    add("file", "Show me server/settings.conf.", "eu-west",
        files={"server/settings.conf": "region = eu-west\nreplicas = 3"})
    add("file", "Open deploy/staging.conf and tell me the replicas.", 6,
        files={"deploy/staging.conf": "region = us-east\nreplicas = 6\nimage = web-17"})
    add("file", "What is the price of pears in prices.csv?", 5, files={"prices.csv": PRICES})
    # listing
    add("list", "List the files here.", "app.conf", files={"app.conf": APP})
    add("list", "What files are in the docs folder?", "guide.md",
        files={"docs/guide.md": "Start here.", "docs/faq.md": "Questions."})
    add("list", "Which files are there in backup?", "nginx.conf",
        files={"backup/nginx.conf": "port = 80", "notes.txt": "hello"})
    # notes
    add("note", "What's my note called wifi?", "4417", notes={"wifi": "4417"})
    add("note", "Read my dentist note.", "Thursday", notes={"dentist": "Thursday 10:30"})
    add("note", ["Save a note called groceries with the text milk and eggs.",
                 "What's on my groceries note?"], "milk")
    add("note", ["Remember that my locker code is 3391: save it as a note named locker.",
                 "What is my locker code?"], 3391)
    # chains
    add("chain", "How much do 12 pears cost according to prices.csv?", 60, files={"prices.csv": PRICES})
    add("chain", "My note rent has my monthly rent. How much is that for a year?", 15000,
        notes={"rent": "1250"})
    add("chain", "What do the three invoices in invoices/march.csv add up to?", 6540,
        files={"invoices/march.csv": INVOICES})
    add("chain", "Read app.conf and double its port.", 16886, files={"app.conf": APP})
    # several calls
    add("multi", "What is 12 * 12, and what time is it?", "12:57")
    add("multi", "Tell me the port in app.conf and the port in config/database.conf.", 5432,
        files={"app.conf": APP, "config/database.conf": DB})
    # errors to recover from
    add("error", "Read apps.conf.", 8443, files={"app.conf": APP})
    add("error", "What's the gym note say?", "6:45", notes={"gym_time": "6:45 on Mondays"})
    # no tool needed
    add("notool", "My flight number is LH 438. Repeat it back to me.", "LH 438")
    add("notool", "Hi! Who are you?", {"regex": "[Aa]ssistant|[Cc]edar|[Hh]elp"})
    add("notool", "My printer is called Brother HL-2270. Which printer do I have?", "HL-2270")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "..", "tests", "eval", "everyday.jsonl"))
    args = ap.parse_args(argv)
    ts = tasks()
    try:
        with open(args.out, "w") as f:
            for t in ts:
                f.write(json.dumps(t, ensure_ascii=False) + "\n")
    except OSError as e:
        print(f"make_everyday_tasks: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {len(ts)} tasks to {os.path.normpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
