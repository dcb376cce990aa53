/* Verity status page: poll the small JSON endpoint while the state is not final and
   update the text in place (an aria-live region announces it). No page reloads. */
(function () {
  "use strict";
  var root = document.getElementById("state");
  if (!root || !window.fetch) { return; }
  var url = root.getAttribute("data-poll-url");
  var first = parseInt(root.getAttribute("data-poll-seconds"), 10) || 3;
  var delay = first;
  var maxDelay = parseInt(root.getAttribute("data-poll-max-seconds"), 10) || 30;
  var timer = null;

  function setPayAgain(action) {
    var box = document.getElementById("state-actions");
    var form = document.getElementById("pay-again-form");
    if (!action) {
      if (form) { form.parentNode.removeChild(form); }
      return;
    }
    if (form) { form.setAttribute("action", action); return; }
    form = document.createElement("form");
    form.id = "pay-again-form";
    form.method = "post";
    form.action = action;
    var button = document.createElement("button");
    button.type = "submit";
    button.id = "pay-again";
    button.className = "primary";
    button.textContent = "Pay again";
    form.appendChild(button);
    box.appendChild(form);
  }

  function apply(state) {
    var changed = state.code !== root.getAttribute("data-code");
    root.setAttribute("data-code", state.code);
    root.className = "state state-" + state.code;
    var h = document.getElementById("state-h");
    var m = document.getElementById("state-message");
    if (h.textContent !== state.headline) { h.textContent = state.headline; }
    if (m.textContent !== state.message) { m.textContent = state.message; }
    document.title = state.headline;
    setPayAgain(state.can_pay_again ? state.pay_again_action : null);
    // The page's safe action belongs to the state it was drawn for ("finish the step",
    // "check again"): once the state moved on, it is no longer the thing to do.
    var safe = document.querySelector("#state-actions a[data-for-code]");
    if (safe && (safe.getAttribute("data-for-code") !== state.code || state.final)) {
      safe.parentNode.removeChild(safe);
    }
    if (state.final) {
      root.setAttribute("data-final", "true");
      var note = document.getElementById("refresh-note");
      if (note) { note.parentNode.removeChild(note); }
    }
    return changed;
  }

  function schedule() {
    if (root.getAttribute("data-final") === "true") { return; }
    timer = window.setTimeout(poll, delay * 1000);
  }

  function poll() {
    timer = null;
    if (document.hidden) { return; }  // resumed by visibilitychange
    window.fetch(url, { cache: "no-store", credentials: "same-origin",
                        headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
      .then(function (state) {
        var changed = apply(state);
        // Quick while things move, slower while nothing changes.
        delay = changed ? first : Math.min(maxDelay, Math.ceil(delay * 1.5));
        schedule();
      })
      .catch(function () { delay = Math.min(maxDelay, delay * 2); schedule(); });
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer === null) { poll(); }
  });
  schedule();
}());
