// The copy buttons beside identifiers (cleanup.admin.idents): copy the whole value.
"use strict";
document.addEventListener("click", function (event) {
  var button = event.target.closest && event.target.closest("button.copy[data-copy]");
  if (!button || !navigator.clipboard) return;
  event.preventDefault();
  navigator.clipboard.writeText(button.dataset.copy).then(function () {
    button.textContent = "copied";
    setTimeout(function () { button.textContent = "copy"; }, 1500);
  });
});
