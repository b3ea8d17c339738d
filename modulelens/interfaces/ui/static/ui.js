// modulelens ui: the copy buttons of the "use this capture" snippets. A button names the element
// whose text it copies (data-copy="ID"). The clipboard API needs a secure context (loopback is one);
// elsewhere (a --host server over plain http) the text is selected for Ctrl+C instead.
"use strict";
document.addEventListener("click", function (event) {
  const button = event.target.closest("button[data-copy]");
  if (!button) {
    return;
  }
  const source = document.getElementById(button.dataset.copy);
  if (!source) {
    return;
  }
  const label = button.textContent;
  const done = function (text) {
    button.textContent = text;
    button.dataset.state = text;
    window.setTimeout(function () { button.textContent = label; }, 2000);
  };
  const select = function () {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    done("selected: press Ctrl+C");
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(source.textContent).then(function () { done("copied"); }, select);
  } else {
    select();
  }
});
