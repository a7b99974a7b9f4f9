"""Procedural workflow scenarios: structured evidence of the kinds users decide on, labelled by rule.

The thirteen kinds of :mod:`noulengine.curricula.procedural` are small puzzles (bags, tables, logs).
What users send is workflow evidence: an agent run's trace summary, a vendor invoice beside its
purchase order, a security alert with its context, a support conversation with the account, a
request beside a tool catalogue. Five kinds here generate such states with several typed
questions each (choice, score, noul), whose labels follow *exactly* from written rules over the
state (each rule is stated in the generator's docstring), so a model learns to read counters,
amounts and flags and to match them to the option descriptions:

``agent_trace``, ``invoice_match``, ``security_alert``, ``support_thread``, ``tool_routing``.

Every question is asked either in a standard wording (the option names and descriptions a
workflow would use) or re-asked with renamed labels (:func:`~noulengine.curricula.procedural.label_style`,
opaque codes) and paraphrased descriptions; the trainer permutes every row's options. Levels 0-4
add noise fields, borderline values and distractor options (tool routing: tools sharing the
request's object or its action).

Nothing is drawn from an evaluation suite: every name, number and sentence comes from the pools
below; the trainer's overlap guard still checks every state. Deterministic: ``generate(n, seed)``
returns the same records for the same arguments (ids ``scen-<seed>-<index>``).
"""

from __future__ import annotations

import functools
import random
from typing import Callable

from noulengine.curricula.procedural import LEVELS, _choice, _noul, _score, generate_from, label_style, opaque_names

URGENCY = (("No time pressure; can wait indefinitely.", "Routine; handle within the normal queue.",
            "Elevated; should be handled within the same week.", "Critical; requires action within the same day."),
           ("Whenever convenient.", "Normal queue.", "Within a few days.", "Today, immediately."),
           ("low", "normal", "high", "critical"),
           ("Can wait.", "This month is fine.", "This week.", "Right now."))


def _ask(rng: random.Random, instructions: tuple[str, ...], concepts: dict[str, tuple[tuple[str, ...], tuple[str, ...]]],
         gold: str, *, standard_share: float = 0.4) -> tuple[dict, dict]:
    """A choice question over ``concepts`` (concept -> (names, descriptions)); the first name and
    description are the standard wording, used with probability ``standard_share``; otherwise the
    labels are renamed (a synonym in a drawn style, or an opaque code) and the description
    paraphrased, so the gold can only be found by reading the descriptions."""
    if rng.random() < standard_share:
        options = {names[0]: descs[0] for names, descs in concepts.values()}
        label = {c: concepts[c][0][0] for c in concepts}
    else:
        opaque = rng.random() < 0.25
        codes = opaque_names(rng, len(concepts)) if opaque else None
        style = label_style(rng)
        label, used = {}, set()
        for i, (c, (names, _)) in enumerate(concepts.items()):
            name = codes[i] if opaque else style(rng.choice([n for n in names if style(n) not in used] or [c]))
            label[c] = name
            used.add(name)
        options = {label[c]: rng.choice(concepts[c][1]) for c in concepts}
    return _choice(rng.choice(instructions), options, label[gold])


def _levels(rng: random.Random, instructions: tuple[str, ...], variants: tuple[tuple[str, ...], ...], level: int):
    return _score(rng.choice(instructions), list(rng.choice(variants)), level)


def _statement(rng: random.Random, balanced: bool, wordings: tuple[tuple[str, str], ...], truth: bool,
               yes: str | None = None, no: str | None = None):
    """A yes/no question on one statement. ``wordings`` are (statement, its negation) pairs, one drawn;
    with ``balanced`` the negation is asked half the time (the gold flipped, the yes/no descriptions
    swapped), so a field's gold is "yes" half the time whatever the base rate of ``truth``: v5's
    scenario statements were true on 16-30% of records, and v5 answered them "no" throughout. Without
    ``balanced`` no extra random number is drawn (the v3 and v5 mixes stay byte-identical)."""
    positive, negative = rng.choice(wordings) if len(wordings) > 1 else wordings[0]  # one wording: no draw
    if balanced and rng.random() < 0.5:
        return _noul(negative, not truth, rng, no, yes)
    return _noul(positive, truth, rng, yes, no)


# -- agent_trace ---------------------------------------------------------------------------------

_TASKS_READ = ("Summarise last week's error logs for the payments service.", "List the open pull requests older than 30 days.",
               "Report the disk usage of every build server.", "Check which user accounts have not logged in this year.",
               "Compare the staging and production configuration files.", "Count the failed login attempts since Monday.")
_TASKS_WRITE = ("Rotate the API keys of the reporting service.", "Upgrade the web servers to the latest patch release.",
                "Archive the closed support tickets from last quarter.", "Resize the analytics database cluster.",
                "Migrate the mailing list to the new provider.", "Clean up unused container images in the registry.",
                "Renew the domain certificates on the edge proxies.", "Apply the new firewall rules to the test network.")
_CONSTRAINTS = ("Do not modify production resources.", "Stay within a $20 cloud budget.", "Never delete customer data.",
                "Ask before any irreversible change.", "Only touch hosts tagged 'staging'.", "Finish within 15 minutes.")


def _agent_trace(rng, level, balanced: bool = False):
    """Rules: outcome = harmful if a constraint was violated, else failure if the run ended
    unfinished with tool errors on at least half its steps, else partial if it ended unfinished or
    with tool errors, else success. risk = 3 if a constraint was violated, 2 if any irreversible
    action, 1 for a task that writes, 0 for a read-only task. action / urgency / review follow the
    outcome: harmful -> stop, critical, review; failure -> human review, within the week, review;
    partial -> observe, routine, no review; success -> continue, no pressure, no review."""
    writes = rng.random() < 0.6
    task = rng.choice(_TASKS_WRITE if writes else _TASKS_READ)
    steps = rng.randint(3, 40)
    kind = rng.choice(("success", "success", "partial", "failure", "harmful"))
    errors = violations = 0
    irreversible = rng.choice((0, 0, 1, 2)) if writes else 0
    finished = True
    if kind == "partial":
        errors, finished = rng.choice(((rng.randint(1, max(1, steps // 3)), True), (0, False),
                                       (rng.randint(1, max(1, steps // 3)), False)))
    elif kind == "failure":
        errors, finished = rng.randint((steps + 1) // 2, steps), False
    elif kind == "harmful":
        violations, errors = rng.randint(1, 3), rng.choice((0, 0, 1, 2))
    if violations:
        outcome = "harmful"
    elif not finished and errors * 2 >= steps:
        outcome = "failure"
    elif not finished or errors:
        outcome = "partial"
    else:
        outcome = "success"
    risk = 3 if violations else 2 if irreversible else 1 if writes else 0
    summary = {"steps": steps, "tool_errors": errors, "constraint_violations": violations,
               "irreversible_actions": irreversible, "duration_s": round(rng.uniform(5, 900), 1),
               "finished": finished}
    if level >= 2:  # noise fields that decide nothing
        summary["tokens_used"] = rng.randint(2_000, 90_000)
        summary["retries"] = rng.randint(0, 3)
    state = {"agent": {"autonomy": rng.choice(("autonomous", "checkpointed", "supervised")),
                       "model": rng.choice(("ops-agent-2", "helper-v3", "runner-mini"))},
             "task": task, "constraints": rng.sample(_CONSTRAINTS, rng.randint(1, 2)), "trace_summary": summary}
    outcomes = {
        "success": (("success", "completed", "done", "succeeded"), ("The agent completed the task correctly.",
                    "Finished the job with no errors or violations.", "The task was fully accomplished.")),
        "partial": (("partial", "incomplete", "partly done"), ("The agent made progress but did not fully complete the task.",
                    "Some of the work got done, not all of it.", "Unfinished or error-prone, yet with progress.")),
        "failure": (("failure", "failed", "unsuccessful"), ("The agent did not accomplish the task.",
                    "The run broke down: most steps errored and the task is not done.", "Nothing useful was achieved.")),
        "harmful": (("harmful", "damaging", "violation"), ("The agent took an action that caused damage or violated a constraint.",
                    "The run broke one of its stated constraints.", "Unsafe: a rule it was given was violated.")),
    }
    act = {"success": "continue", "partial": "observe", "failure": "human_review", "harmful": "stop"}[outcome]
    actions = {
        "continue": (("continue", "proceed", "let run"), ("Let the agent proceed without interruption.", "Nothing to do; carry on.")),
        "observe": (("observe", "flag", "sample later"), ("Keep running, but flag the trace for later sampling.",
                    "Log it for a later spot check.")),
        "human_review": (("human_review", "review", "escalate"), ("Queue this trace for a human to review.",
                         "Send the trace to a person.")),
        "stop": (("stop", "halt", "kill"), ("Halt the agent now.", "Shut the run down immediately.")),
    }
    urgency = {"success": 0, "partial": 1, "failure": 2, "harmful": 3}[outcome]
    risk_levels = (("Benign: read-only or clearly safe actions.", "Low: routine writes within scope.",
                    "Moderate: irreversible or out-of-scope actions.", "High: destructive, security-relevant, or policy-violating actions."),
                   ("read-only", "routine writes", "irreversible changes", "constraint broken"))
    return state, [
        lambda: _ask(rng, ("How did this agent run turn out?", "Classify the result of this run.", "What was the outcome?"),
                     outcomes, outcome),
        lambda: _ask(rng, ("What should the observability system do with this trace?", "Pick the monitor's next step."),
                     actions, act),
        lambda: _levels(rng, ("How risky was the agent's behaviour in this trace?", "Rate the risk of what the agent did."),
                        risk_levels, risk),
        lambda: _levels(rng, ("How quickly does this trace need attention?", "How urgent is this trace?"), URGENCY, urgency),
        lambda: _statement(rng, balanced, (("This trace requires human review.", "This trace needs no human review."),
                                           ("A person should look at this run.", "No person needs to look at this run.")),
                           outcome in ("harmful", "failure"), "A human should inspect this run.",
                           "No human attention is warranted."),
        lambda: _statement(rng, balanced, (("The agent broke one of its constraints.",
                                            "The agent kept every one of its constraints."),), violations > 0),
    ]


# -- invoice_match -------------------------------------------------------------------------------

_VENDORS = ("Northwind Supplies", "Blue Harbor Tools", "Kestrel Paper Co", "Orbit Components", "Maple Office Goods",
            "Granite Hardware", "Sunline Electrics", "Pioneer Packaging")


def _invoice_match(rng, level, balanced: bool = False):
    """Three-way match rules: the invoice matches when invoiced qty = received qty <= ordered qty and
    the unit price equals the order's (invoice total = qty x unit). Discrepancy = |invoice total -
    matched total|: 0 none, < $1 trivial, < 10 % moderate, else material (a duplicate or a missing
    order is material). Disposition: duplicate or no purchase order -> reject; material -> manual
    review; moderate -> hold; none or trivial -> approve. Urgency by payment: overdue or a discount
    expiring within 3 days -> critical; due within 7 days -> within the week; within 30 -> routine;
    else no pressure."""
    unit = round(rng.uniform(2, 600), 2)
    ordered = rng.randint(2, 60)
    received = rng.choice((ordered, ordered, rng.randint(1, ordered)))
    kind = rng.choice(("match", "match", "qty", "price", "rounding", "duplicate", "no_po"))
    inv_qty, inv_unit = received, unit
    if kind == "qty":
        inv_qty = received + rng.randint(1, max(1, received // 2))
    elif kind == "price":
        inv_unit = round(unit * rng.choice((1.03, 1.06, 1.2, 1.5, 2.0)), 2)
    inv_total = round(inv_qty * inv_unit, 2)
    if kind == "rounding":
        inv_total = round(inv_total + rng.choice((0.01, 0.02, -0.01, 0.05)), 2)
    matched_total = round(received * unit, 2)
    inv_id = f"INV-{rng.randint(1000, 9999)}"
    prior = [f"INV-{rng.randint(1000, 9999)}" for _ in range(rng.randint(0, 3))]
    duplicate = kind == "duplicate"
    prior = [p for p in prior if p != inv_id] + ([inv_id] if duplicate else [])
    rng.shuffle(prior)
    no_po = kind == "no_po"
    diff = abs(inv_total - matched_total)
    if duplicate or no_po:
        severity = 3
    elif diff == 0:
        severity = 0
    elif diff < 1:
        severity = 1
    elif diff < 0.1 * matched_total:
        severity = 2
    else:
        severity = 3
    matches = not no_po and not duplicate and severity == 0
    disposition = ("reject" if duplicate or no_po else "manual_review" if severity == 3 else "hold" if severity == 2
                   else "approve")
    days = rng.choice((rng.randint(-20, -1), rng.randint(0, 7), rng.randint(8, 30), rng.randint(31, 60)))
    discount = rng.choice((None, None, rng.randint(0, 10)))
    urgency = 3 if days < 0 or (discount is not None and discount <= 3) else 2 if days <= 7 else 1 if days <= 30 else 0
    state = {"invoice": {"id": inv_id, "vendor": rng.choice(_VENDORS), "currency": "USD",
                         "lines": [{"sku": f"SKU-{rng.randint(100, 999)}", "qty": inv_qty, "unit_usd": inv_unit,
                                    "total_usd": inv_total}], "total_usd": inv_total},
             "purchase_order": None if no_po else {"id": f"PO-{rng.randint(100, 9999)}", "lines": [{"qty": ordered, "unit_usd": unit}],
                                                   "total_usd": round(ordered * unit, 2)},
             "delivery": {"received_qty": received, "condition": rng.choice(("accepted", "accepted", "damaged box, contents fine"))},
             "payment": {"days_until_due": days, "status": "overdue" if days < 0 else "open",
                         "discount_expires_in_days": discount, "terms": rng.choice(("net 30", "net 45", "net 15"))},
             "vendor_history": {"prior_invoice_ids": prior, "invoices_12m": rng.randint(len(prior), 30),
                                "disputes_12m": rng.randint(0, 3)}}
    dispositions = {
        "approve": (("approve", "pay", "accept"), ("Matches the order and delivery; approve for payment.", "Everything checks out: pay it.")),
        "hold": (("hold", "pause", "on hold"), ("Something needs confirming before payment; hold pending clarification.",
                 "A real but modest difference: wait for the vendor's answer.")),
        "manual_review": (("manual_review", "finance review", "audit"), ("A human in finance must review the discrepancy.",
                          "A large difference: send it to an accountant.")),
        "reject": (("reject", "decline", "refuse"), ("Should not be paid: duplicate, unauthorised or materially wrong.",
                   "Do not pay: already billed or without an order.")),
    }
    sev_levels = (("None: everything reconciles.", "Trivial: rounding or a cosmetic difference.",
                   "Moderate: a real difference worth confirming.", "Material: a large or unexplained difference."),
                  ("no difference", "cents only", "a real gap", "a large gap or no basis to pay"))
    return state, [
        lambda: _ask(rng, ("How should this vendor invoice be dispositioned?", "What happens to this invoice?"),
                     dispositions, disposition),
        lambda: _levels(rng, ("How material is any discrepancy between the invoice, the order and the delivery?",
                              "Rate the mismatch between invoice, order and receipt."), sev_levels, severity),
        lambda: _statement(rng, balanced, (("The invoice reconciles with the purchase order and the recorded delivery.",
                                            "The invoice does not reconcile with the purchase order and the recorded "
                                            "delivery."),
                                           ("Invoice, order and delivery agree.",
                                            "Invoice, order and delivery disagree somewhere.")), matches,
                           "Line items, quantities and amounts reconcile.",
                           "There is a discrepancy against the order or the delivery."),
        lambda: _statement(rng, balanced, (("This invoice appears to duplicate an invoice already submitted.",
                                            "This invoice duplicates no invoice already submitted."),), duplicate),
        lambda: _levels(rng, ("How time-sensitive is processing this invoice?", "How soon must this invoice be handled?"),
                        URGENCY, urgency),
    ]


# -- security_alert ------------------------------------------------------------------------------

_RULES = {  # rule -> (description, evidence template, is a credential signal)
    "impossible_travel": ("a login came from two distant countries within an hour",
                          "User {p} signed in from {c1} and, 40 minutes later, from {c2}.", True),
    "brute_force_success": ("many failed logins followed by a success",
                            "{n} failed password attempts for {p}, then a successful login from {ip}.", True),
    "malware_signature": ("an endpoint agent matched a known malware signature",
                          "The endpoint agent flagged a file run by {p} on host {h} as known malware.", False),
    "mass_download": ("an unusual volume of data was downloaded",
                      "{p} downloaded {n} GB from the document store in ten minutes.", False),
    "new_admin_grant": ("a principal was granted administrator rights",
                        "{p} was added to the administrators group from {ip}.", True),
}
_COUNTRIES = ("Norway", "Brazil", "Japan", "Kenya", "Canada", "Peru", "Vietnam", "Poland")


def _security_alert(rng, level, balanced: bool = False):
    """Rules: a benign explanation (the source is on the allowlist, or a change window is active)
    makes the alert a false positive; otherwise it is a true positive. A credential compromise is a
    true positive of a credential rule (impossible travel, brute force, admin grant). Severity: 0 no
    privileges on a low-criticality asset, 1 no privileges, 2 internal privileges, 3 production or
    secrets, 4 production or secrets on a crown-jewel asset. Disposition: false positive -> close
    (explained) ; true positive with severity >= 3 -> contain; else investigate; a true positive of
    a non-credential rule on a principal with no privileges -> monitor. Urgency: contain ->
    critical, investigate -> within the week, monitor -> routine, close -> no pressure."""
    rule = rng.choice(sorted(_RULES))
    desc, evidence, credential_rule = _RULES[rule]
    allow = rng.random() < 0.3
    change = rng.random() < 0.25
    privileges = rng.choice(([], ["read:wiki"], ["deploy:staging"], ["deploy:production"], ["secrets:read"],
                             ["deploy:production", "secrets:read"]))
    criticality = rng.choice(("low", "medium", "high", "crown_jewel"))
    true_positive = not (allow or change)
    high = any(p in ("deploy:production", "secrets:read") for p in privileges)
    if not privileges:
        severity = 0 if criticality == "low" else 1
    elif not high:
        severity = 2
    else:
        severity = 4 if criticality == "crown_jewel" else 3
    if not true_positive:
        disposition = "close_benign"
    elif severity >= 3:
        disposition = "contain"
    elif not privileges and not credential_rule:
        disposition = "monitor"
    else:
        disposition = "investigate"
    urgency = {"contain": 3, "investigate": 2, "monitor": 1, "close_benign": 0}[disposition]
    name = rng.choice(("svc-backup", "j.moreno", "build-bot", "a.khan", "ops-admin-7", "reporting-svc"))
    text = evidence.format(p=name, c1=rng.choice(_COUNTRIES), c2=rng.choice(_COUNTRIES), n=rng.randint(8, 300),
                           ip=f"198.51.100.{rng.randint(2, 250)}", h=f"HOST-{rng.randint(10, 99)}")
    state = {"alert": {"rule": rule, "description": desc, "evidence": text},
             "context": {"source_on_allowlist": allow, "change_window_active": change, "asset_criticality": criticality},
             "principal": {"name": name, "type": rng.choice(("user", "service_account")), "privileges": privileges,
                           "mfa_enrolled": rng.random() < 0.6}}
    if level >= 2:
        state["history"] = {"prior_alerts_90d": rng.randint(0, 6), "logins_30d": rng.randint(5, 400)}
    dispositions = {
        "close_benign": (("close_benign", "close", "dismiss"), ("Expected, explainable activity; close without analyst time.",
                         "Explained by an allowlist or a change window: close it.")),
        "contain": (("contain", "isolate", "lock down"), ("Contain the host or account immediately; do not wait for triage.",
                    "Cut off the account or host right now.")),
        "investigate": (("investigate", "open case", "triage"), ("Warrants an analyst opening an investigation.",
                        "An analyst should dig into it.")),
        "monitor": (("monitor", "watch", "keep an eye"), ("Not clearly malicious, but worth watching for recurrence.",
                    "Low stakes: watch whether it happens again.")),
    }
    sev_levels = (("Negligible: no access to anything sensitive.", "Low: limited access, easily reversed.",
                   "Moderate: access to internal systems or non-public data.", "High: access to production, secrets or customer data.",
                   "Critical: active compromise of crown-jewel systems."),
                  ("nothing sensitive", "limited", "internal systems", "production or secrets", "crown jewels"))
    return state, [
        lambda: _ask(rng, ("How should this security alert be dispositioned?", "What should the SOC do with this alert?"),
                     dispositions, disposition),
        lambda: _levels(rng, ("How severe is the potential impact if this alert is real?", "Rate the blast radius."),
                        sev_levels, severity),
        lambda: _statement(rng, balanced, (("This alert reflects genuinely malicious or unauthorised activity.",
                                            "This alert reflects benign or authorised activity."),), true_positive,
                           "The underlying behaviour is malicious or unauthorised.",
                           "Benign activity, a misconfiguration, or a known false positive."),
        lambda: _statement(rng, balanced, (("The evidence indicates a credential or account has been compromised.",
                                            "The evidence shows no credential or account has been compromised."),),
                           true_positive and credential_rule),
        lambda: _levels(rng, ("How quickly must a responder act on this alert?",), URGENCY, urgency),
    ]


# -- support_thread ------------------------------------------------------------------------------

_ISSUES = {  # category -> customer openings
    "billing": ("I was charged twice for my subscription this month.", "My invoice shows a plan I never signed up for.",
                "The payment for my renewal failed but the money left my account."),
    "delivery": ("My order still has not arrived and tracking stopped updating.", "The courier left my parcel at the wrong address.",
                 "The box arrived but half the items are missing."),
    "technical": ("The app crashes every time I open the settings page.", "Exports have been failing with a timeout since yesterday.",
                  "The dashboard shows an error instead of my reports."),
    "account": ("I cannot log in after changing my email address.", "Please move my account to the yearly plan.",
                "I need to add two colleagues to our workspace."),
    "refund": ("I returned the jacket last week, please refund me.", "I cancelled within the trial, I want my money back.",
               "The product was faulty and I would like a full refund."),
}
_MOOD = {0: ("", " Thanks!"), 1: (" This is a bit annoying.", " Honestly a little frustrating."),
         2: (" This is the third time this happens, I am really unhappy.", " Again the same problem, this is unacceptable."),
         3: (" Fix this today or I cancel and dispute the charge.", " I am done: close my account unless this is solved now.")}


def _support_thread(rng, level, balanced: bool = False):
    """Rules: the category is the topic of the customer's opening message. Churn risk is the mood
    the customer states (0 none, 1 mild frustration, 2 repeat problem or complaint, 3 a threat to
    cancel or dispute). Action: churn 3 -> escalate to a human; a refund with an order number given
    -> execute the refund; no order number where one is needed (billing, delivery, refund) ->
    request information; the customer says it is solved -> close; else answer directly. A human is
    needed for an escalation or a refund. Urgency: churn 3 -> critical; churn 2 or a refund ->
    within the week; closed -> no pressure; else routine."""
    category = rng.choice(sorted(_ISSUES))
    churn = rng.choice((0, 0, 1, 2, 3))
    solved = churn == 0 and rng.random() < 0.2
    needs_order = category in ("billing", "delivery", "refund")
    has_order = rng.random() < 0.6
    thread = [{"role": "customer", "text": rng.choice(_ISSUES[category]) + rng.choice(_MOOD[churn])}]
    if needs_order:
        thread.append({"role": "agent", "text": "Sorry about that. Could you share your order number?"})
        if has_order:
            thread.append({"role": "customer", "text": f"Sure, it is #{rng.choice('ABCDEFGH')}{rng.randint(10000, 99999)}."})
    if solved:
        thread.append({"role": "customer", "text": "Never mind, it works now. Thanks, all sorted!"})
    if churn == 3:
        action = "escalate_to_human"
    elif solved:
        action = "close_no_action"
    elif needs_order and not has_order:
        action = "request_information"
    elif category == "refund":
        action = "execute_refund"
    else:
        action = "answer_directly"
    urgency = 3 if churn == 3 else 2 if churn == 2 or category == "refund" else 0 if solved else 1
    state = {"account": {"tier": rng.choice(("free", "pro", "business", "enterprise")), "tenure_months": rng.randint(1, 80),
                         "prior_tickets_90d": rng.randint(0, 2) if churn < 2 else rng.randint(2, 6)},
             "thread": thread}
    if level >= 2:
        state["account"]["seats"] = rng.randint(1, 200)
    categories = {
        "account": (("account", "access", "profile"), ("Login, plan changes, profile or access management.", "Sign-in and account settings.")),
        "billing": (("billing", "charges", "payments"), ("A charge, invoice, subscription or payment problem.", "Money taken or billed wrongly.")),
        "delivery": (("delivery", "shipping", "logistics"), ("Shipping, fulfilment or delivery of a physical item.", "Parcels and couriers.")),
        "refund": (("refund", "money back", "returns"), ("The customer is explicitly asking for money back.", "A request to be reimbursed.")),
        "technical": (("technical", "tech support", "bugs"), ("The product or service is not working as expected.", "Errors, crashes and outages.")),
    }
    actions = {
        "answer_directly": (("answer_directly", "reply", "self-serve"), ("The assistant can resolve this itself with information it already has.",
                            "Reply with the fix or the explanation.")),
        "close_no_action": (("close_no_action", "close", "done"), ("No further action is warranted; the matter is settled.",
                            "Already resolved; nothing more to do.")),
        "escalate_to_human": (("escalate_to_human", "escalate", "hand off"), ("Hand off to a human agent with the appropriate authority.",
                              "Pass it to a senior person now.")),
        "execute_refund": (("execute_refund", "refund", "reimburse"), ("Issue the refund or credit the customer is owed.",
                           "Send the money back.")),
        "request_information": (("request_information", "ask for details", "need info"),
                                ("More detail is needed from the customer before anything can be done.",
                                 "Ask the customer for the missing details.")),
    }
    churn_levels = (("No sign of dissatisfaction.", "Mild frustration, but the relationship is intact.",
                     "Clearly unhappy; repeat problems or explicit complaints.", "Imminent: threatening to cancel, dispute or leave."),
                    ("happy", "slightly annoyed", "unhappy", "about to leave"))
    return state, [
        lambda: _ask(rng, ("What is this customer conversation primarily about?", "Which queue owns this conversation?"),
                     categories, category),
        lambda: _ask(rng, ("What should the assistant do next with this conversation?", "Choose the next step."), actions, action),
        lambda: _levels(rng, ("How likely is this customer to stop doing business with us because of this interaction?",
                              "Rate the churn risk."), churn_levels, churn),
        lambda: _statement(rng, balanced, (("This conversation requires a human agent rather than automated handling.",
                                            "This conversation can be handled automatically, without a human "
                                            "agent."),), action in ("escalate_to_human", "execute_refund"),
                           "A human must take over: judgement, authority or empathy is required.",
                           "Automation can carry this to resolution."),
        lambda: _levels(rng, ("How time-sensitive is this conversation?",), URGENCY, urgency),
    ]


# -- tool_routing --------------------------------------------------------------------------------

# object -> (singular, plural, request phrases needing it); actions -> (verb for names, description, request verb)
_OBJECTS = {
    "weather": ("weather forecast", "weather forecasts", ("will it rain in {city} tomorrow", "the temperature in {city} this week")),
    "flight": ("flight", "flights", ("a flight from {city} to Lisbon", "departures from {city} airport")),
    "hotel": ("hotel", "hotels", ("a hotel room in {city}", "places to stay near {city} station")),
    "stock": ("stock quote", "stock quotes", ("the share price of a tech company", "how the market index did today")),
    "crypto": ("cryptocurrency", "cryptocurrencies", ("the bitcoin price", "all coins currently traded")),
    "recipe": ("recipe", "recipes", ("a vegan pasta dish", "something to cook with chickpeas")),
    "movie": ("movie", "movies", ("films showing in {city} tonight", "reviews of a new thriller")),
    "song": ("song", "songs", ("the lyrics of a pop hit", "tracks by a jazz pianist")),
    "news": ("news article", "news articles", ("today's headlines about {city}", "the latest football results")),
    "exchange": ("exchange rate", "exchange rates", ("how many yen one euro buys", "converting dollars to pesos")),
    "job": ("job posting", "job postings", ("nurse vacancies in {city}", "remote developer jobs")),
    "restaurant": ("restaurant", "restaurants", ("a sushi place in {city}", "somewhere to eat brunch nearby")),
    "vehicle": ("vehicle record", "vehicle records", ("the history of a used car by its VIN", "the owner of a licence plate")),
    "domain": ("domain name", "domain names", ("whether a website name is still free", "who registered a web address")),
    "email": ("email address", "email addresses", ("whether an email address is valid", "the mail server of a company")),
    "translation": ("translation", "translations", ("this sentence in German", "what a Japanese phrase means")),
    "holiday": ("public holiday", "public holidays", ("the bank holidays in Spain next year", "whether schools close on Friday")),
    "package": ("shipment", "shipments", ("where my parcel is", "the delivery status of tracking number 1Z999")),
}
_ACTIONS = {
    "get": ("get", "Returns the details of a single {s}.", "show me"),
    "list": ("list", "Lists all available {p}.", "list all"),
    "search": ("search", "Searches {p} by keyword and filters.", "find"),
    "create": ("create", "Creates a new {s} record.", "create"),
}
_CITIES = ("Oslo", "Lima", "Hanoi", "Nairobi", "Krakow", "Osaka", "Quito", "Porto")


def _tool_name(rng, action: str, obj: str, style: int) -> str:
    words = _OBJECTS[obj][0].split()
    if style == 0:
        return action + "".join(w.title() for w in words)
    if style == 1:
        return " ".join(w.title() for w in words) + " API"
    if style == 2:
        return f"{words[-1]}/{action}-{'-'.join(words)}"
    return f"{action.title()} {' '.join(w.title() for w in _OBJECTS[obj][1].split())}"


def _tool_routing(rng, level, balanced: bool = False):
    """Rule: the request names one object (weather, flights, ...); the gold tool serves that object.
    Levels add tools: level 0-1 distractors serve other objects; from level 2 one distractor serves
    the same object with another action (the request's action then decides), and the catalogue grows
    to 3-8 tools. Tool names come in four API naming styles, so only the descriptions identify them."""
    obj = rng.choice(sorted(_OBJECTS))
    gold_action = rng.choice(("get", "search", "list"))
    k = min(8, 3 + level + rng.randint(0, 1))
    tools = [(gold_action, obj)]
    if level >= 2:
        tools.append((rng.choice([a for a in _ACTIONS if a != gold_action]), obj))
    for o in rng.sample([o for o in _OBJECTS if o != obj], k - len(tools)):
        tools.append((rng.choice(sorted(_ACTIONS)), o))
    rng.shuffle(tools)
    catalogue, seen = [], set()
    for action, o in tools:
        name = _tool_name(rng, action, o, rng.randrange(4))
        while name in seen:
            name += " v2"
        seen.add(name)
        s, p, _ = _OBJECTS[o]
        catalogue.append((action, o, name, _ACTIONS[action][1].format(s=s, p=p)))
    gold_name = next(n for a, o, n, _ in catalogue if (a, o) == (gold_action, obj))
    phrase = rng.choice(_OBJECTS[obj][2]).format(city=rng.choice(_CITIES))
    verb = {"get": rng.choice(("Can you show me", "I need", "Tell me")), "search": rng.choice(("Help me find", "Search for")),
            "list": rng.choice(("List all", "Give me every option for"))}[gold_action]
    request = f"{verb} {phrase}." + (rng.choice((" Thanks!", " It is for a trip next month.", " My boss asked for it."))
                                     if level >= 1 else "")
    state = {"request": request, "tools": [{"name": n, "description": d} for _, _, n, d in catalogue]}
    return state, [
        lambda: _choice(rng.choice(("Which single tool from the catalog should be called for this request?",
                                    "Which tool answers this request?", "Route the request to one tool.")),
                        {n: d for _, _, n, d in catalogue}, gold_name),
        lambda: _tool_statement(rng, balanced, "The tool '{}' can serve this request.", gold_name, catalogue, True,
                                other_objects_only=True),
        lambda: _tool_statement(rng, balanced, "The tool '{}' is the right one for this request.", gold_name,
                                catalogue, False),
    ]


def _tool_statement(rng, balanced: bool, template: str, gold_name: str, catalogue, gold: bool, *,
                    other_objects_only: bool = False):
    """A yes/no question naming one tool. Unbalanced (v3, v5), each wording named one side only
    ("can serve": always the gold tool, "is the right one": always a distractor), so the wording
    alone gave the answer; with ``balanced`` either wording names the gold tool or a distractor
    with equal chance, and only the catalogue and the request tell them apart. A "can serve"
    distractor (``other_objects_only``) serves another object: a tool for the same object with
    another action could arguably serve the request, and "no" there would be a noisy label."""
    if balanced:
        gold = rng.random() < 0.5
    if gold:
        return _noul(template.format(gold_name), True, rng)
    gold_obj = next(o for _, o, n, _ in catalogue if n == gold_name)
    pool = [n for _, o, n, _ in catalogue if n != gold_name and (o != gold_obj or not (balanced and other_objects_only))]
    return _noul(template.format(rng.choice(pool)), False, rng)


SCENARIOS: dict[str, Callable] = {
    "agent_trace": _agent_trace, "invoice_match": _invoice_match, "security_alert": _security_alert,
    "support_thread": _support_thread, "tool_routing": _tool_routing,
}


def generate(n: int, seed: int = 0, *, kinds: tuple[str, ...] | None = None, levels: tuple[int, ...] = LEVELS,
             balanced_nouls: bool = False) -> list[dict]:
    """``n`` records, kinds and levels cycled evenly, deterministic in ``seed`` (ids ``scen-<seed>-<i>``,
    ``category`` ``scenario:<kind>``; ``task`` and ``level`` are metadata that never reach the model).

    ``balanced_nouls``: every yes/no statement is asked in its negated wording half the time, and the
    tool statements name the gold tool or a distractor with equal chance (:func:`_statement`,
    :func:`_tool_statement`), so "yes" is the gold on about half of each field's questions and no
    wording predicts the answer. Off (the default), the records are those of the v3 and v5 mixes.

    Raises:
        KeyError: an unknown kind.
    """
    table = SCENARIOS if not balanced_nouls else {k: functools.partial(f, balanced=True) for k, f in SCENARIOS.items()}
    return generate_from(table, n, seed, tasks=kinds, levels=levels, id_prefix="scen", what="scenario kind",
                         max_questions=5, category="scenario")
