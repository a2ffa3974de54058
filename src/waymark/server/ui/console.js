// The console's shell: the token, who it is, the pages and the polling they share
// (docs/console.md).
import { setToken, token, whoami } from "./api.js";
import { h } from "./dom.js";
import { foldsPage } from "./folds.js";
import { pipelinesPage } from "./pipelines.js";
import { queuesPage } from "./queues.js";
import { recoveryPage } from "./recovery.js";
import { routersPage } from "./routers.js";
import { topicPage } from "./topic.js";
import { topicsPage } from "./topics.js";
import { writersPage } from "./writers.js";

const view = document.getElementById("view");
const status = document.getElementById("status");
let current = null; // the shown page's AbortController

function route() {
  const [page, ...rest] = (window.location.hash.replace(/^#\/?/, "") || "topics").split("/");
  return { page, name: rest.length ? decodeURIComponent(rest.join("/")) : null };
}

// Run `poll` now and every `ms` until the page is left; a failure is shown, not fatal.
function poller(signal) {
  return async (ms, poll) => {
    while (!signal.aborted) {
      try {
        await poll();
        status.textContent = "";
      } catch (error) {
        if (signal.aborted) return;
        status.textContent = error.message;
      }
      await new Promise((resolve) => setTimeout(resolve, ms));
    }
  };
}

async function show() {
  if (current) current.abort();
  const abort = (current = new AbortController());
  const { page, name } = route();
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page || (page === "topic" && link.dataset.page === "topics"));
  }
  view.replaceChildren(h("p", { class: "muted" }, "loading…"));
  let identity;
  try {
    identity = await whoami();
  } catch (error) {
    view.replaceChildren(h("p", { "data-testid": "auth-error" }, `${error.message} — give a token above.`));
    document.getElementById("who").textContent = "";
    return;
  }
  document.getElementById("who").textContent = identity.auth
    ? `${identity.name ?? "token"}: ${identity.scopes.join(" ")}` : "auth off";
  const context = { name, identity, signal: abort.signal, every: poller(abort.signal) };
  const pages = { topics: topicsPage, topic: topicPage, queues: queuesPage, routers: routersPage, writers: writersPage,
    folds: foldsPage, recovery: recoveryPage, pipelines: pipelinesPage };
  const render = pages[page] || topicsPage;
  try {
    await render(view, context);
  } catch (error) {
    if (!abort.signal.aborted) view.replaceChildren(h("p", { "data-testid": "page-error" }, error.message));
  }
}

document.getElementById("token").value = token();
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken(document.getElementById("token").value.trim());
  show();
});
document.getElementById("token-clear").addEventListener("click", () => {
  setToken("");
  document.getElementById("token").value = "";
  show();
});
window.addEventListener("hashchange", show);
show();
